"""A streamed run (``run(..., stream_to=DIR)``, what ``narwhal simulate`` does) writes the same
files as a run held in memory, holds nothing of a finished request, and its percentiles are
exact."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from narwhal.cli import main
from narwhal.sim.results import percentile, record_rows, write
from narwhal.sim.runner import run
from narwhal.sim.scenario import Scenario
from narwhal.sim.streaming import exact_percentiles
from tests.sim.conftest import scenario

FAULTY: dict[str, Any] = {
    "faults": [
        {"kind": "hang", "engine": "http://sim-d1", "at_s": 2.0, "duration_s": 3.0},
        {
            "kind": "stall",
            "role": "decode",
            "rate_per_hour": 3600.0,
            "duration_s": 1.0,
            "probability": 0.5,
            "after_tokens": 3,
        },
        {"kind": "inband_error", "engine": "http://sim-d0", "at_s": 1.0, "duration_s": 2.0},
    ],
    "recovery": {"max_attempts": 2},
    "workload": {"kind": "gamma", "rate": 30.0, "cv": 2.0, "duration_s": 8.0},
}
FILES = ("records.csv", "timeline.csv", "decisions.jsonl", "summary.json", "summary.txt")


def _files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in FILES}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"router": {"replicas": 3}},  # decisions merged from one file per replica
        {"sim": {"max_sim_s": 4.0}},  # unfinished rows: cut off, and never started
    ],
    ids=["one-router", "three-replicas", "cut-off"],
)
def test_streamed_files_equal_the_in_memory_ones(tmp_path: Path, extra: dict[str, Any]) -> None:
    sc = scenario(**{**FAULTY, **extra})
    held = run(sc)
    write(held, tmp_path / "held")
    streamed = run(sc, stream_to=tmp_path / "streamed")
    write(streamed, tmp_path / "streamed")
    assert _files(tmp_path / "streamed") == _files(tmp_path / "held")
    assert streamed.records == [] and streamed.arrivals == [] and streamed.samples == []
    rows = record_rows(held)
    assert streamed.requests == len(rows) and streamed.finished == len(held.records)
    if "sim" in extra:  # the cut really left requests unfinished, some never started
        unfinished = [r for r in rows if r["outcome"] == "unfinished"]
        assert unfinished and any(r["arrival"] > 4.0 for r in unfinished)
    assert len(held.decisions) > 0


def _steady(requests: int) -> Scenario:
    return scenario(
        workload={"kind": "poisson", "rate": 40.0, "duration_s": None, "max_requests": requests},
        router={"replicas": 2},
    )


def test_a_streamed_run_holds_only_the_requests_in_flight(tmp_path: Path) -> None:
    """The driver's per-request state (requests started and not finished, rows held for an
    earlier one, deliveries, which replica served a request) peaks at what is in flight, the
    same for 4x the requests at the same rate, and is empty at the end."""
    peaks = []
    for requests in (300, 1200):
        result = run(_steady(requests), stream_to=tmp_path / str(requests))
        streamed = result.streamed
        assert streamed is not None and result.finished == requests
        assert streamed.live == {} and streamed.delivered == {} and streamed.held == 0
        assert result.replica_of == {} and result.delivered == {}
        peaks.append((streamed.peak_live, streamed.peak_held, streamed.peak_delivered))
        rows = (tmp_path / str(requests) / "records.csv").read_text().splitlines()
        assert len(rows) == requests + 1
        assert rows[1].startswith("req-0,") and rows[-1].startswith(f"req-{requests - 1},")
    (live_small, held_small, _), (live_big, held_big, delivered_big) = peaks
    assert 0 < live_big <= 2 * live_small and live_big < 1200 // 20  # in flight, not the run
    assert held_big <= 2 * max(held_small, 10) and held_big < 1200 // 20
    assert delivered_big <= live_big


def test_simulate_command_streams(tmp_path: Path) -> None:
    """``narwhal simulate`` writes the files of the in-memory run, plot included."""
    toml = tmp_path / "s.toml"
    toml.write_text(
        "\n".join(
            [
                'name = "stream"',
                "[fleet]",
                "prefill = 1",
                "decode = 1",
                "[workload]",
                'kind = "poisson"',
                "rate = 10.0",
                "duration_s = 5.0",
                'prompt = { dist = "fixed", value = 100 }',
                'output = { dist = "fixed", value = 10 }',
                "[sim]",
                "seed = 2",
            ]
        )
        + "\n"
    )
    assert main(["simulate", str(toml), "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    from narwhal.sim.plot import plot
    from narwhal.sim.results import summarize
    from narwhal.sim.scenario import load_scenario

    held = run(load_scenario(str(toml)))
    summary = write(held, tmp_path / "held")
    plot(held, record_rows(held), summary, tmp_path / "held" / "plot.png")
    assert summarize(held) == summary
    for name in (*FILES, "plot.png"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "held" / name).read_bytes()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_exact_percentiles_equal_sorting(seed: int) -> None:
    rng = random.Random(seed)
    columns: list[list[float | None]] = [
        [round(rng.lognormvariate(-3, 2), 6) for _ in range(5000)],  # wide: many buckets
        [round(rng.choice([0.5, 0.25, 1e4]), 6) for _ in range(3000)],  # ties, one huge value
        [None if rng.random() < 0.5 else round(rng.random(), 6) for _ in range(7)],
        [None] * 4,  # no values
        [0.0, 0.0, 3.0],
    ]
    length = max(len(c) for c in columns)
    rows = [tuple(c[i] if i < len(c) else None for c in columns) for i in range(length)]
    values = [[v for v in c if v is not None] for c in columns]
    qs = (0.0, 1.0, 50.0, 99.0, 99.9, 100.0)
    got = exact_percentiles(
        lambda: iter(rows),
        [len(v) for v in values],
        [max((abs(x) for x in v), default=0.0) for v in values],
        qs,
    )
    assert got == [[percentile(v, q) for q in qs] for v in values]
