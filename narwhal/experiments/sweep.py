"""A whole sweep: plan it, run it on a backend, aggregate, write the files, draw the recipe.

Rule kept here: the files a sweep writes depend only on the spec, ``--seed`` and ``--quick``;
never on the backend, the worker count or the wall clock (wall time is only printed).
:func:`redraw` rebuilds a finished sweep from its ``runs.csv`` to redraw the figures after a
change to a recipe, without simulating again.

Theory of operation: :func:`run_sweep` builds the plan (validating every point's scenario),
runs its tasks through :func:`narwhal.experiments.backends.execute` and aggregates them into
run rows and point rows. :func:`write_sweep` writes, into ``--out``:

- ``runs.csv``: one row per run: point, replicate, rate multiplier, seed, parameters, fleet
  counts, metrics;
- ``points.csv``: one row per point: parameters, means over replicates, spreads, goodput;
- ``sweep.json``: the spec as run (after ``--quick`` and ``--seed``), run and request counts;
- ``recommendation.json``: the setting that beats the baseline with the stated confidence, or
  null and why (:mod:`narwhal.experiments.recommendation`);
- ``<recipe>*.png`` with ``<recipe>*.csv``: the recipe's figures, each with what it draws.

While it runs, ``runs.journal.jsonl`` holds every finished run (see
:mod:`narwhal.experiments.journal`), so an interrupted sweep keeps them and ``--resume``
continues it; :func:`finish` removes it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from narwhal.experiments.aggregate import SweepResult, csv_text, point_rows, run_rows
from narwhal.experiments.backends import execute
from narwhal.experiments.journal import JOURNAL_NAME, Journal, load_journal
from narwhal.experiments.plan import Plan, build_plan
from narwhal.experiments.recipes import RECIPES
from narwhal.experiments.recommendation import as_json, recommend
from narwhal.experiments.spec_model import SweepSpec
from narwhal.experiments.worker import METRIC_FIELDS, RunOutcome, is_counted


def prepare(spec: SweepSpec, *, seed: int | None = None, quick: bool = False) -> Plan:
    """The plan for ``spec`` after ``--quick`` and ``--seed``."""
    spec = spec.with_seed(seed)
    if quick:
        spec = spec.quick_version()
    samples = spec.sweep.recipe is not None and RECIPES[spec.sweep.recipe].needs_samples
    return build_plan(spec, samples=samples)


def run_sweep(
    spec: SweepSpec,
    *,
    seed: int | None = None,
    quick: bool = False,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = False,
    journal_dir: Path | None = None,
    resume: bool = False,
) -> SweepResult:
    """Plan and run a sweep; only the journal is written (when ``journal_dir`` is given: every
    finished run as it ends, see :mod:`narwhal.experiments.journal`). ``resume`` takes the runs
    the journal already holds instead of running them again."""
    plan = prepare(spec, seed=seed, quick=quick)
    done: dict[int, RunOutcome] = {}
    journal: Journal | None = None
    if journal_dir is not None:
        path = journal_dir / JOURNAL_NAME
        if resume:
            done = load_journal(path, plan.tasks)
        elif path.exists():
            raise ValueError(
                f"{path} holds the runs of an interrupted sweep: --resume continues it "
                "(remove the file to start over)"
            )
        journal = Journal(path, plan.tasks, keep=resume)
    todo = [task for task in plan.tasks if task.index not in done]
    try:
        fresh = execute(
            todo,
            workers=workers,
            ray_address=ray_address,
            progress=progress,
            desc=plan.spec.sweep.name,
            on_outcome=journal.record if journal is not None else None,
        )
    finally:
        if journal is not None:
            journal.close()
    by_task = {**done, **{outcome.task: outcome for outcome in fresh}}
    outcomes = [by_task[task.index] for task in plan.tasks]
    run_fields, runs = run_rows(plan, outcomes)
    point_fields, points = point_rows(plan, runs)
    return SweepResult(plan.spec, plan, outcomes, run_fields, runs, point_fields, points, quick)


def finish(out: Path) -> None:
    """A sweep's files are written: its journal has served."""
    (out / JOURNAL_NAME).unlink(missing_ok=True)


def _cell(text: str) -> Any:
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def redraw(
    spec: SweepSpec, out: Path, *, seed: int | None = None, quick: bool = False
) -> SweepResult:
    """Rebuild a finished sweep from ``out/runs.csv`` (no simulation), to redraw its figures.

    The CSV must be this spec's (same runs, same seeds); recipes that need per-request samples
    (``retries``) cannot be redrawn this way."""
    plan = prepare(spec, seed=seed, quick=quick)
    path = out / "runs.csv"
    if any(task.samples for task in plan.tasks):
        raise ValueError(f"the {plan.spec.sweep.recipe} recipe needs per-request samples; re-run")
    try:
        with path.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    seeds = [int(row.get("seed") or -1) for row in rows]
    if seeds != [task.seed for task in plan.tasks]:
        raise ValueError(f"{path} is not this sweep's (its runs or seeds differ)")
    known = set(METRIC_FIELDS)
    outcomes = [
        RunOutcome(
            task.index,
            {k: _cell(v) for k, v in row.items() if k in known or is_counted(k)},
            None,
            0.0,
        )
        for task, row in zip(plan.tasks, rows, strict=True)
    ]
    run_fields, runs = run_rows(plan, outcomes)
    labels = [k for k in run_fields if k not in known and not is_counted(k)]
    ours = list(csv.DictReader(csv_text(labels, runs).splitlines()))
    for index, (mine, theirs) in enumerate(zip(ours, rows, strict=True)):
        for key in labels:  # seeds alike (seed_by = "replicate") do not make the runs alike
            if mine[key] != theirs.get(key):
                raise ValueError(
                    f"{path} is not this sweep's: run {index} has {key} = "
                    f"{theirs.get(key)!r}, the spec gives {mine[key]!r}"
                )
    point_fields, points = point_rows(plan, runs)
    return SweepResult(plan.spec, plan, outcomes, run_fields, runs, point_fields, points, quick)


def describe(result: SweepResult) -> dict[str, Any]:
    spec = result.spec
    return {
        "name": spec.sweep.name,
        "spec": spec.source,
        "quick": result.quick,
        "sweep": spec.sweep.model_dump(),
        "base": spec.base,
        "grid": spec.grid,
        "cases": [c.model_dump() for c in spec.cases],
        "goodput": spec.goodput.model_dump() if spec.goodput is not None else None,
        "figure": spec.figure,
        "points": len(result.plan.points),
        "runs": len(result.plan.tasks),
        "simulated_requests": result.requests,
    }


def check_out(out: Path) -> None:
    """Refuse an output path that could not take the files (before a sweep runs, not after)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")


def write_sweep(result: SweepResult, out: Path, *, figures: bool = True) -> list[Path]:
    """Write every result file into ``out``; returns the paths written."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fields, rows in (
        ("runs.csv", result.run_fields, result.runs),
        ("points.csv", result.point_fields, result.points),
    ):
        (out / name).write_text(csv_text(fields, rows), "utf-8")
        written.append(out / name)
    meta = json.dumps(describe(result), indent=2, sort_keys=True, default=str) + "\n"
    (out / "sweep.json").write_text(meta, "utf-8")
    written.append(out / "sweep.json")
    advice = as_json(result, recommend(result))
    text = json.dumps(advice, indent=2, sort_keys=True, default=str) + "\n"
    (out / "recommendation.json").write_text(text, "utf-8")
    written.append(out / "recommendation.json")
    if figures and result.spec.sweep.recipe is not None:
        from narwhal.experiments.figures import draw  # matplotlib: only when drawing

        written += draw(result, out)
    return written
