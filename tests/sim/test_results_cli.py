"""Results are byte-identical for a seed; the CLI runs the embedded default scenario."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.sim.plot import plot
from narwhal.sim.results import record_rows, summarize, table, write
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


def _write(tmp: Path, seed: int | None, *, with_plot: bool = True) -> dict[str, bytes]:
    result = run(scenario(**FAULTY), seed)
    write(result, tmp)
    if with_plot:
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
    other = _write(tmp_path / "c", 12345, with_plot=False)
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
    fleet_line = next(line for line in err.splitlines() if "fleet.prefil" in line)
    assert "valid keys: " in fleet_line and " prefill," in fleet_line  # the keys [fleet] takes
    assert "recovery.eject_after" in err
    assert "faults[0].kind" in err


def test_tpot_counts_the_tokens_delivered_before_an_early_done() -> None:
    early = {"kind": "early_done", "engine": "http://sim-d0", "at_s": 0.0, "duration_s": 1e6}
    early["after_tokens"] = 5
    result = run(scenario(faults=[early], workload={"duration_s": 2.0}))
    rows = record_rows(result)
    cut = [r for r in rows if "http://sim-d0" in r["engines"]]
    whole = [r for r in rows if "http://sim-d0" not in r["engines"]]
    assert cut and whole
    assert {(r["status"], r["output_tokens"], r["delivered_tokens"]) for r in cut} == {(200, 20, 5)}
    assert {(r["status"], r["delivered_tokens"]) for r in whole} == {(200, 20)}
    for r in cut + whole:
        expected = (r["finished_s"] - r["first_byte_s"]) / (r["delivered_tokens"] - 1)
        assert r["tpot_s"] == pytest.approx(expected, abs=2e-6)  # from rounded columns


HUNG_FOREVER = {
    "engine": {
        "first_token_timeout_s": 86400,
        "decode_read_timeout_s": 0,
        "request_timeout_s": 86400,
    },
    "fleet": {"prefill": 1, "decode": 1},
    "workload": {
        "kind": "fixed",
        "arrivals_s": [0.0, 0.5, 1.0, 9.0],
        "prompt": None,
        "output": None,
    },
    "faults": [{"kind": "hang", "role": "decode", "at_s": 0.0, "duration_s": 1e7}],
    "sim": {"max_sim_s": 5.0, "health_checks": False},  # req-3 would arrive at 9 s
}


def test_requests_still_running_when_the_run_stops_are_reported_unfinished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(scenario(**HUNG_FOREVER))
    rows = record_rows(result)
    assert [(r["request_id"], r["status"], r["outcome"]) for r in rows] == [
        (f"req-{i}", None, "unfinished") for i in range(4)
    ]
    summary = summarize(result, rows)
    assert (summary["requests"], summary["unfinished"], summary["statuses"]) == (4, 4, {})
    assert summary["fault_windows"] == 1
    path = tmp_path / "hung.toml"
    path.write_text(
        "[engine]\nfirst_token_timeout_s = 86400\ndecode_read_timeout_s = 0\n"
        "request_timeout_s = 86400\n[fleet]\nprefill = 1\ndecode = 1\n"
        '[workload]\nkind = "fixed"\narrivals_s = [0.0, 0.5]\n'
        '[[faults]]\nkind = "hang"\nrole = "decode"\nat_s = 0.0\nduration_s = 1e7\n'
        "[sim]\nmax_sim_s = 5.0\n"
    )
    assert main(["simulate", str(path), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    captured = capsys.readouterr()
    assert "unfinished" in captured.out
    assert "2 of 2 requests had not finished" in captured.err


def test_fault_windows_after_the_end_of_the_run_are_not_counted() -> None:
    late = {"kind": "crash", "engine": "http://sim-p0", "at_s": 500.0, "duration_s": 1.0}
    counted = {"duration_s": None, "max_requests": 10}  # at_s past duration_s is refused
    result = run(scenario(faults=[late], workload=counted))
    assert result.sim_end_s < 500.0 and result.fault_windows == []
    assert [f.at_s for f in result.unrun_faults] == [500.0]
    assert summarize(result)["fault_windows"] == 0


def test_only_a_bundled_trace_is_cited_and_only_when_used(tmp_path: Path) -> None:
    assert "trace" not in summarize(run(scenario(workload={"duration_s": 1.0})))
    fixed = {"kind": "fixed", "arrivals_s": [0.0], "prompt": None, "output": None}
    assert "trace" not in summarize(run(scenario(workload=fixed)))
    drawn = {"kind": "poisson", "rate": 5.0, "duration_s": 1.0, "prompt": None, "output": None}
    assert "AzurePublicDataset" in summarize(run(scenario(workload=drawn)))["trace"]
    own = tmp_path / "own.csv"
    own.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,50,5\n")
    mine = run(scenario(workload={"kind": "trace", "trace": str(own), "duration_s": 1.0}))
    assert summarize(mine)["trace"] == f"{own}: a trace file"


def test_a_non_streaming_run_does_not_call_the_first_token_the_clients() -> None:
    streamed = table(summarize(run(scenario(workload={"duration_s": 1.0}))))
    whole = table(summarize(run(scenario(workload={"duration_s": 1.0, "stream": False}))))
    assert "TTFT at client" in streamed and "first token (router)" not in streamed
    assert "first token (router)" in whole and "TTFT at client" not in whole


def test_the_cli_raises_the_collectors_thresholds_for_its_run_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    import narwhal.sim.runner
    from narwhal.sim.commands import GC_THRESHOLDS

    seen: list[tuple[int, ...]] = []

    def observed_run(*args: object, **options: object) -> object:  # the thresholds it ran under
        seen.append(gc.get_threshold())
        return run(*args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(narwhal.sim.runner, "run", observed_run)
    before = gc.get_threshold()
    path = tmp_path / "tiny.toml"
    path.write_text(
        '[fleet]\nprefill = 1\ndecode = 1\n[workload]\nkind = "fixed"\narrivals_s = [0.0]\n'
    )
    assert main(["simulate", str(path), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    assert seen == [GC_THRESHOLDS] and gc.get_threshold() == before


def test_fault_records_list_only_the_parameters_their_kind_takes(tmp_path: Path) -> None:
    faults = [
        {"kind": "hang", "engine": "http://sim-d1", "at_s": 1.0, "duration_s": 1.0},
        {"kind": "slow", "engine": "http://sim-d0", "at_s": 1.0, "duration_s": 1.0, "factor": 2.5},
        {
            "kind": "stall",
            "engine": "http://sim-d0",
            "at_s": 1.0,
            "duration_s": 1.0,
            "probability": 0.5,
            "after_tokens": 3,
        },
        {"kind": "http_5xx", "engine": "http://sim-p0", "at_s": 1.0, "duration_s": 1.0},
    ]
    workload = {"kind": "gamma", "rate": 5.0, "cv": 1.0, "duration_s": 3.0}
    write(run(scenario(faults=faults, workload=workload)), tmp_path)
    with (tmp_path / "faults.csv").open(newline="") as handle:
        rows = {row["kind"]: row for row in csv.DictReader(handle)}
    given = {
        kind: {k: v for k, v in row.items() if k in ("factor", "probability", "after_tokens") and v}
        for kind, row in rows.items()
    }
    assert given == {
        "hang": {},
        "slow": {"factor": "2.5"},
        "stall": {"probability": "0.5", "after_tokens": "3"},
        "http_5xx": {"probability": "1.0"},
    }
