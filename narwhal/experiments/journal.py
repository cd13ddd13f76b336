"""The sweep journal: each finished run is written to disk as it ends, so an interrupted sweep
loses nothing and ``narwhal sweep --resume`` runs only what is missing.

Rule kept here: a journal line holds one complete run and is taken back only for the very task
that produced it — the same index, seed, scenario mapping and samples flag, compared through a
digest of all of them — so a resumed sweep writes byte-identical files to an uninterrupted one,
and a journal from another spec (or another ``--seed``/``--quick``) is refused, not mixed in.

Theory of operation: :class:`Journal` appends one JSON line per :class:`RunOutcome` (metrics,
per-request samples) to ``<out>/runs.journal.jsonl`` and flushes it; JSON keeps floats exactly
(``repr`` round-trips). :func:`load_journal` reads it back, skipping a torn last line (a crash
in the middle of a write). The sweep removes the journal once its result files are written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import IO, Any

from narwhal.experiments.plan import RunTask
from narwhal.experiments.worker import RunOutcome

JOURNAL_NAME = "runs.journal.jsonl"


def task_digest(task: RunTask) -> str:
    """What makes a run the same run: everything :func:`run_task` reads from the task."""
    identity = [
        task.index,
        task.point,
        task.replicate,
        task.rate_multiplier,
        task.seed,
        task.scenario,
        task.samples,
    ]
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class Journal:
    """Appends finished runs to a journal file (open from construction to :meth:`close`)."""

    def __init__(self, path: Path, tasks: list[RunTask], *, keep: bool) -> None:
        self.path = path
        self._digests = {task.index: task_digest(task) for task in tasks}
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a" if keep else "w", encoding="utf-8")

    def record(self, outcome: RunOutcome) -> None:
        line = {
            "task": outcome.task,
            "digest": self._digests[outcome.task],
            "metrics": outcome.metrics,
            "first_bytes": None if outcome.first_bytes is None else list(outcome.first_bytes),
            "wall_s": outcome.wall_s,
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def load_journal(path: Path, tasks: list[RunTask]) -> dict[int, RunOutcome]:
    """The finished runs a journal holds, by task index; ValueError if it is not this plan's."""
    digests = {task.index: task_digest(task) for task in tasks}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    done: dict[int, RunOutcome] = {}
    for number, text in enumerate(lines, 1):
        try:
            line: dict[str, Any] = json.loads(text)
            task, digest = int(line["task"]), str(line["digest"])
            samples = line["first_bytes"]
            outcome = RunOutcome(
                task,
                dict(line["metrics"]),
                None if samples is None else tuple(float(x) for x in samples),
                float(line["wall_s"]),
            )
        except (ValueError, KeyError, TypeError):
            if number == len(lines):
                break  # torn by the interruption: that run is simply run again
            raise ValueError(f"{path}:{number}: not a journal line") from None
        if digests.get(task) != digest:
            raise ValueError(
                f"{path} is another sweep's (run {task} differs from this spec's); "
                "remove it or choose another --out"
            )
        done[task] = outcome
    return done
