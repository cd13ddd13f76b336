"""Workload generators: Poisson and gamma arrivals, trace replay."""

from __future__ import annotations

import itertools
import random
import statistics

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
