"""An interrupted sweep keeps its finished runs; ``--resume`` runs only the rest and writes the
same files an uninterrupted sweep writes."""

from __future__ import annotations

from pathlib import Path

import pytest

import narwhal.experiments.backends as backends
from narwhal.cli import main
from narwhal.experiments.journal import JOURNAL_NAME, Journal, load_journal
from narwhal.experiments.plan import RunTask
from narwhal.experiments.spec import load_spec
from narwhal.experiments.sweep import prepare
from narwhal.experiments.worker import RunOutcome

RESULT_FILES = ("runs.csv", "points.csv", "sweep.json")


def _sweep(spec: Path, out: Path, *extra: str) -> int:
    return main(["sweep", str(spec), "--workers", "0", "--no-progress", "--out", str(out), *extra])


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, runs: int) -> None:
    """Ctrl-C arriving once ``runs`` runs have ended (and been journalled)."""
    record = Journal.record
    seen = []

    def record_then_interrupt(self: Journal, outcome: RunOutcome) -> None:
        record(self, outcome)
        seen.append(outcome.task)
        if len(seen) == runs:
            raise KeyboardInterrupt

    monkeypatch.setattr(Journal, "record", record_then_interrupt)


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    ran: list[int] = []
    run_task = backends.run_task

    def counted(task: RunTask) -> RunOutcome:
        ran.append(task.index)
        return run_task(task)

    monkeypatch.setattr(backends, "run_task", counted)
    return ran


def test_resume_runs_only_the_missing_runs_and_writes_the_same_files(
    tiny_spec: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert _sweep(tiny_spec, whole) == 0
    assert not (whole / JOURNAL_NAME).exists()  # a finished sweep leaves no journal
    total = len(prepare(load_spec(tiny_spec)).tasks)
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 2)
        assert _sweep(tiny_spec, resumed) == 130
    assert f"2 of {total} runs are kept" in capsys.readouterr().err
    assert not (resumed / "runs.csv").exists()
    ran = _count_runs(monkeypatch)
    assert _sweep(tiny_spec, resumed, "--resume") == 0
    assert len(ran) == total - 2  # the two journalled runs were not run again
    for name in RESULT_FILES:
        assert (resumed / name).read_bytes() == (whole / name).read_bytes(), name
    assert not (resumed / JOURNAL_NAME).exists()


def test_a_journal_is_never_overwritten_or_mixed_with_another_sweep(
    tiny_spec: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 1)
        assert _sweep(tiny_spec, out) == 130
    journal = (out / JOURNAL_NAME).read_bytes()
    capsys.readouterr()
    assert _sweep(tiny_spec, out) == 2  # without --resume: refused, the runs kept
    assert "--resume continues it" in capsys.readouterr().err
    assert _sweep(tiny_spec, out, "--resume", "--seed", "99") == 2  # another sweep's journal
    assert "is another sweep's" in capsys.readouterr().err
    assert (out / JOURNAL_NAME).read_bytes() == journal


def test_a_torn_last_line_is_run_again_and_a_bad_middle_line_is_refused(
    tiny_spec: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 2)
        assert _sweep(tiny_spec, out) == 130
    path = out / JOURNAL_NAME
    tasks = prepare(load_spec(tiny_spec)).tasks
    first, second = path.read_text("utf-8").splitlines()
    path.write_text(first + "\n" + second[: len(second) // 2], "utf-8")
    assert len(load_journal(path, tasks)) == 1
    path.write_text(second[: len(second) // 2] + "\n" + first + "\n", "utf-8")
    with pytest.raises(ValueError, match=":1: not a journal line"):
        load_journal(path, tasks)
