"""Results are byte-identical for a seed; the CLI runs the embedded default scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.sim.plot import plot
from narwhal.sim.results import record_rows, summarize, write
from narwhal.sim.runner import run
from tests.sim.conftest import scenario

FAULTY = {
    "faults": [
        {"kind": "hang", "engine": "http://sim-d1", "at_s": 3.0, "duration_s": 4.0},
        {
            "kind": "stall",
            "role": "decode",
            "rate_per_hour": 3600.0,
            "duration_s": 1.0,
            "probability": 0.5,
            "after_tokens": 3,
        },
    ],
    "workload": {"kind": "gamma", "rate": 20.0, "cv": 2.0, "duration_s": 8.0},
}


def _write(tmp: Path, seed: int | None) -> dict[str, bytes]:
    result = run(scenario(**FAULTY), seed)
    write(result, tmp)
    plot(result, record_rows(result), summarize(result), tmp / "plot.png")
    return {p.name: p.read_bytes() for p in sorted(tmp.iterdir())}


def test_same_seed_gives_byte_identical_results(tmp_path: Path) -> None:
    first = _write(tmp_path / "a", None)
    second = _write(tmp_path / "b", None)
    assert set(first) == {
        "records.csv",
        "summary.json",
        "summary.txt",
        "timeline.csv",
        "conditions.csv",
        "faults.csv",
        "decisions.jsonl",
        "plot.png",
    }
    assert first == second
    other = _write(tmp_path / "c", 12345)
    assert other["records.csv"] != first["records.csv"]


def test_summary_follows_distserve_definitions() -> None:
    result = run(scenario(sim={"slo_ttft_s": 0.05, "slo_tpot_s": 0.02}))
    rows = record_rows(result)
    summary = summarize(result, rows)
    on_time = [
        r for r in rows if r["status"] == 200 and r["first_byte_s"] <= 0.05 and r["tpot_s"] <= 0.02
    ]
    assert summary["on_time"] == len(on_time)
    assert summary["slo_attainment_pct"] == round(100 * len(on_time) / len(rows), 3)
    assert summary["success_pct"] == 100.0
    assert all(r["tpot_s"] > 0 for r in rows)


def test_cli_default_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["simulate", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "ejections" in printed
    for name in ("records.csv", "summary.json", "timeline.csv", "decisions.jsonl", "plot.png"):
        assert (out / name).stat().st_size > 0


def test_cli_names_the_bad_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        "[fleet]\nprefil = 2\ndecode = 1\n[recovery]\neject_after = 0\n"
        '[workload]\nduration_s = 1.0\n[[faults]]\nkind = "melt"\nat_s = 1.0\n'
    )
    assert main(["simulate", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "fleet.prefil: unknown key" in err
    assert "recovery.eject_after" in err
    assert "faults[0].kind" in err
