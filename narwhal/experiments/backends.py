"""Backends: run a plan's tasks in this process, over local processes, or over a Ray cluster.

Rule kept here: a backend only decides *where* :func:`~narwhal.experiments.worker.run_task`
runs; outcomes are returned in plan order whatever order they finished in, so every backend
gives the same results for the same tasks.

Theory of operation:

- in-process (``workers = 0``): a plain loop; what tests and debuggers want.
- local processes (the default; ``workers`` defaults to the CPU count, capped by the tasks): a
  ``concurrent.futures.ProcessPoolExecutor`` with the ``spawn`` start method, so it behaves the
  same on Linux, macOS and Windows and never forks a process holding threads.
- Ray (``ray_address``): ``"local"`` starts a private local Ray; anything else is passed to
  ``ray.init(address=...)`` (``"auto"``, ``"ray://head:10001"``). Ray is an optional extra
  (``pip install 'narwhal-router[ray]'``) imported only here and only then; the cluster's workers
  must be able to import ``narwhal`` (the same version). Each task asks for one CPU.

Tasks are submitted longest first (highest rate multiplier) so a pool does not end on one
straggler. A progress bar (tqdm, on stderr) counts finished runs and simulated requests.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from narwhal.experiments.plan import RunTask
from narwhal.experiments.worker import RunOutcome, run_task


class BackendError(RuntimeError):
    """A backend could not start, or a run failed."""


class _Progress:
    """A tqdm bar on stderr (or nothing), fed one outcome at a time."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.bar: Any = None
        self.requests = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)

    def update(self, outcome: RunOutcome) -> None:
        self.requests += int(outcome.metrics.get("requests", 0))
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.requests:,} requests", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _longest_first(tasks: list[RunTask]) -> list[RunTask]:
    return sorted(tasks, key=lambda t: (-(t.rate_multiplier or 1.0), t.index))


def _in_process(tasks: list[RunTask]) -> Iterable[RunOutcome]:
    for task in tasks:
        try:
            outcome = run_task(task)
        except Exception as error:  # reported as the process pool reports it
            raise BackendError(f"run {task.index} failed: {error!r}") from error
        yield outcome


def _processes(tasks: list[RunTask], workers: int) -> Iterable[RunOutcome]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending: dict[Future[RunOutcome], RunTask] = {
            pool.submit(run_task, task): task for task in _longest_first(tasks)
        }
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    task = pending.pop(future)
                    try:
                        yield future.result()
                    except Exception as error:
                        raise BackendError(f"run {task.index} failed: {error!r}") from error
        finally:
            for future in pending:
                future.cancel()


def _ray(tasks: list[RunTask], address: str, workers: int | None) -> Iterable[RunOutcome]:
    try:
        import ray
    except ImportError:
        raise BackendError(
            "--ray needs Ray, an optional extra: pip install 'narwhal-router[ray]'"
        ) from None
    started = False
    if not ray.is_initialized():
        options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address == "local" and workers:
            options["num_cpus"] = workers
        try:
            ray.init(address=None if address == "local" else address, **options)
        except Exception as error:
            raise BackendError(f"cannot start or reach Ray at {address!r}: {error}") from error
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_task)
        pending = {remote.remote(task): task for task in _longest_first(tasks)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                task = pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as error:
                    raise BackendError(f"run {task.index} failed: {error!r}") from error
    finally:
        if started:
            ray.shutdown()


def execute(
    tasks: list[RunTask],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = False,
    desc: str = "sweep",
    on_outcome: Callable[[RunOutcome], None] | None = None,
) -> list[RunOutcome]:
    """Run every task; outcomes in task order. ``workers = 0`` runs in this process."""
    bar = _Progress(len(tasks), desc, progress)
    stream: Iterable[RunOutcome]
    if ray_address is not None:
        stream = _ray(tasks, ray_address, workers)
    elif workers == 0 or not tasks:
        stream = _in_process(tasks)
    else:
        count = workers if workers is not None else (os.cpu_count() or 1)
        stream = _processes(tasks, max(1, min(count, len(tasks))))
    outcomes: dict[int, RunOutcome] = {}
    try:
        for outcome in stream:
            outcomes[outcome.task] = outcome
            bar.update(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    finally:
        bar.close()
    return [outcomes[task.index] for task in tasks]
