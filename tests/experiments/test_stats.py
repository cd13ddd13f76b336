"""The statistics behind a sweep's recommendation: intervals, the decision and the power
calculation, on inputs whose answers are known."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as scipy_stats

from narwhal.experiments.stats import (
    Metric,
    decide,
    mean_interval,
    paired_interval,
    replicates_needed,
    welch_interval,
)

GOODPUT = Metric("goodput_rps")
SUCCESS = Metric("success_pct")
P99 = Metric("first_byte_p99_s", higher_is_better=False)
METRICS = (GOODPUT, SUCCESS, P99)


def _noise(seed: int, n: int, sd: float) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0.0, sd) for _ in range(n)]


def _cell(goodput: list[float], success: list[float], p99: list[float]) -> dict[str, list]:
    return {"goodput_rps": goodput, "success_pct": success, "first_byte_p99_s": p99}


def test_the_paired_interval_is_students_t_on_the_differences() -> None:
    cell, base = [10.0, 12.0, 11.0, 15.0], [9.0, 10.0, 10.5, 12.0]
    diffs = [c - b for c, b in zip(cell, base, strict=True)]
    got = paired_interval(cell, base, 0.95)
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    half = scipy_stats.t.ppf(0.975, 3) * sd / 2.0
    assert got.mean == pytest.approx(mean) and got.sd == pytest.approx(sd)
    assert (got.low, got.high) == pytest.approx((mean - half, mean + half))
    # the same numbers as scipy's own one-sample interval
    low, high = scipy_stats.t.interval(0.95, 3, loc=mean, scale=sd / 2.0)
    assert (got.low, got.high) == pytest.approx((low, high))


def test_a_missing_value_drops_its_pair_and_one_value_gives_no_interval() -> None:
    got = paired_interval([1.0, None, 3.0], [0.0, 5.0, 1.0], 0.95)
    assert got.n == 2 and got.mean == pytest.approx(1.5)
    single = mean_interval([4.0], 0.95)
    assert single.mean == 4.0 and math.isnan(single.low) and math.isnan(single.high)


def test_welch_matches_scipy() -> None:
    a, b = [5.0, 6.0, 7.5, 6.2], [4.0, 4.5, 3.9, 5.5, 4.8]
    got = welch_interval(a, b, 0.9)
    test = scipy_stats.ttest_ind(a, b, equal_var=False)
    low, high = test.confidence_interval(0.9)
    assert (got.low, got.high) == pytest.approx((low, high))


def test_a_cell_better_by_a_constant_in_every_replicate_is_recommended() -> None:
    noise = _noise(1, 4, 3.0)
    base = _cell([30 + e for e in noise], [98.0] * 4, [0.8] * 4)
    better = _cell([32 + e for e in noise], [98.0] * 4, [0.8] * 4)  # +2 in every replicate
    same = _cell([30 + e for e in noise], [98.0] * 4, [0.8] * 4)
    decision = decide([base, same, better], 0, METRICS, labels=["base", "same", "better"])
    assert decision.recommended == 2
    assert "better beats the baseline (base) on goodput_rps by +2" in decision.reason
    assert decision.replicates == 4 and decision.replicates_needed is None
    lifted = decision.comparisons[1].intervals["goodput_rps"]
    assert lifted.low == pytest.approx(2.0) and lifted.high == pytest.approx(2.0)


def test_equal_cells_with_noise_are_not_recommended() -> None:
    cells = [
        _cell(
            [30 + e for e in _noise(10 + i, 5, 2.0)],
            [98 + e for e in _noise(20 + i, 5, 0.5)],
            [0.8 + e for e in _noise(30 + i, 5, 0.1)],
        )
        for i in range(12)
    ]
    decision = decide(cells, 0, METRICS, labels=[f"c{i}" for i in range(12)])
    assert decision.recommended is None
    assert decision.reason.startswith(
        "no setting is distinguishable from the baseline at 5 replicates"
    )
    # Bonferroni: each of the 11 intervals at 1 - 0.05/11
    assert decision.per_cell_confidence == pytest.approx(1 - 0.05 / 11)
    assert decision.replicates_needed is not None and decision.replicates_needed > 5
    assert f"about {decision.replicates_needed} replicates would resolve it" in decision.reason


def test_better_on_the_primary_but_worse_on_success_is_not_recommended() -> None:
    noise = _noise(3, 4, 1.0)
    base = _cell([30 + e for e in noise], [98.0 + e / 10 for e in noise], [0.8] * 4)
    risky = _cell([33 + e for e in noise], [97.0 + e / 10 for e in noise], [0.8] * 4)
    decision = decide([base, risky], 0, METRICS, labels=["base", "risky"])
    assert decision.recommended is None
    assert "risky is better on goodput_rps but worse on success_pct" in decision.reason


def test_a_lower_p99_counts_as_better_and_a_higher_as_worse() -> None:
    base = _cell([30.0, 31.0, 29.0], [98.0] * 3, [0.80, 0.90, 0.85])
    faster = _cell([31.0, 32.0, 30.0], [98.0] * 3, [0.70, 0.80, 0.75])
    slower = _cell([31.0, 32.0, 30.0], [98.0] * 3, [0.90, 1.00, 0.95])
    decision = decide([base, slower, faster], 0, METRICS, labels=["base", "slower", "faster"])
    assert decision.recommended == 2
    assert decision.comparisons[0].worse_on == ("first_byte_p99_s",)


def test_one_replicate_resolves_nothing() -> None:
    decision = decide(
        [_cell([1.0], [1.0], [1.0]), _cell([9.0], [1.0], [1.0])], 0, METRICS, labels=["a", "b"]
    )
    assert decision.recommended is None and "at 1 replicate(s)" in decision.reason


def test_replicates_needed_is_the_textbook_paired_power_calculation() -> None:
    # effect size 1 (difference = sd) at 95% and power 0.8: n = 10 for the paired t test
    assert replicates_needed(1.0, 1.0, 0.95) == 10
    # half the effect needs about four times the replicates (the normal approximation: 31.4)
    assert replicates_needed(0.5, 1.0, 0.95) == 34
    assert replicates_needed(0.0, 1.0, 0.95) is None
    assert replicates_needed(1.0, 0.0, 0.95) == 2
    n = replicates_needed(0.3, 1.0, 0.99)
    assert n is not None
    for m, enough in ((n - 1, False), (n, True)):
        lhs = scipy_stats.t.ppf(0.995, m - 1) + scipy_stats.t.ppf(0.8, m - 1)
        assert bool(lhs <= 0.3 * math.sqrt(m)) is enough
