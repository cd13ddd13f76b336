"""Workload generators: Poisson and gamma arrivals, trace replay."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest
from pydantic import ValidationError

from narwhal.sim.workload import LengthDist, WorkloadSettings, generate, load_trace


def _gaps(arrivals: list) -> list[float]:  # type: ignore[type-arg]
    return [b.t - a.t for a, b in itertools.pairwise(arrivals)]


def test_poisson_rate_and_lengths() -> None:
    w = WorkloadSettings(
        kind="poisson",
        rate=50.0,
        duration_s=200.0,
        prompt=LengthDist(dist="uniform", low=10, high=20),
        output=LengthDist(dist="fixed", value=7),
    )
    arrivals = generate(w, random.Random(1))
    assert 9000 < len(arrivals) < 11000
    gaps = _gaps(arrivals)
    assert abs(statistics.stdev(gaps) / statistics.mean(gaps) - 1.0) < 0.05  # cv of Poisson
    assert all(10 <= a.prompt <= 20 and a.output == 7 for a in arrivals)


def test_gamma_is_bursty_with_the_asked_cv() -> None:
    w = WorkloadSettings(kind="gamma", rate=50.0, cv=3.0, max_requests=20000)
    arrivals = generate(w, random.Random(2))
    gaps = _gaps(arrivals)
    assert abs(statistics.mean(gaps) - 0.02) < 0.002
    assert abs(statistics.stdev(gaps) / statistics.mean(gaps) - 3.0) < 0.3
    rows = load_trace("azure2023_conv")  # lengths drawn from the trace by default
    lengths = {(p, o) for _, p, o in rows}
    assert all((a.prompt, a.output) in lengths for a in arrivals[:100])


def test_trace_replay_window_scale_and_repeat() -> None:
    rows = load_trace("azure2023_conv")
    assert len(rows) == 19366 and rows[0][0] == 0.0
    plain = generate(WorkloadSettings(kind="trace", duration_s=60.0), random.Random(0))
    fast = generate(
        WorkloadSettings(kind="trace", duration_s=30.0, rate_scale=2.0), random.Random(0)
    )
    assert len(plain) == len(fast)
    assert [(a.prompt, a.output) for a in plain] == [(a.prompt, a.output) for a in fast]
    looped = generate(
        WorkloadSettings(kind="trace", repeat=True, max_requests=25000), random.Random(0)
    )
    assert len(looped) == 25000
    assert all(b.t >= a.t for a, b in itertools.pairwise(looped))
    code = generate(
        WorkloadSettings(kind="trace", trace="azure2023_code", max_requests=10), random.Random(0)
    )
    assert code[0].prompt == 4808 and code[0].output == 10


def test_a_length_range_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match=r"low \(500\) must be <= high \(100\)"):
        LengthDist(dist="uniform", low=500, high=100)
    with pytest.raises(ValidationError, match="must be <= high"):
        LengthDist(dist="lognormal", low=500, high=100)
    assert LengthDist(dist="fixed", value=7, low=500, high=100).draw(random.Random(0)) == 7


CSV_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("when,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,6\n", "line 2: missing"),
        (CSV_HEADER + "2023-11-16 18:15:46,5,6\n2023-11-16 18:15:47,five,6\n", "line 3: invalid"),
        (CSV_HEADER + "yesterday,5,6\n", "line 2:"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 6}\n{"timestamp": 1}\n', "line 2"),
        (CSV_HEADER, "holds no requests"),
        ("", "holds no requests"),
    ],
    ids=["csv_column", "csv_number", "csv_time", "jsonl_key", "header_only", "empty"],
)
def test_a_malformed_trace_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as caught:
        load_trace(str(path))
    assert str(path) in str(caught.value)


def test_looping_a_trace_window_that_spans_no_time_is_refused(tmp_path: Path) -> None:
    # One request (or several at one instant) has no period to repeat: it used to loop forever.
    path = tmp_path / "one.csv"
    path.write_text(CSV_HEADER + "2023-11-16 18:15:46,5,6\n2023-11-16 18:15:46,7,8\n")
    w = WorkloadSettings(kind="trace", trace=str(path), repeat=True, duration_s=10.0)
    with pytest.raises(ValueError, match="spans no time"):
        generate(w, random.Random(0))
    once = WorkloadSettings(kind="trace", trace=str(path), duration_s=10.0)
    assert len(generate(once, random.Random(0))) == 2


def test_a_workload_without_requests_is_refused() -> None:
    late = WorkloadSettings(kind="trace", start_s=1e9, duration_s=10.0)
    with pytest.raises(ValueError, match=r"no requests after start_s = 1e\+09 s"):
        generate(late, random.Random(0))
