"""The tuning recipe's goodput labels (its recommendation is tested in test_recommendation)."""

from __future__ import annotations

from narwhal.experiments.figures.tuning import goodput_label, lowest_rate


def test_a_goodput_below_the_lowest_rate_is_labelled_with_that_rate() -> None:
    runs = [  # point 0's curve: mean offered rate per multiplier, over two replicates
        {"point": 0, "rate_multiplier": 2.0, "offered_rps": 57.0, "slo_attainment_pct": 40.0},
        {"point": 0, "rate_multiplier": 1.0, "offered_rps": 28.0, "slo_attainment_pct": 80.0},
        {"point": 0, "rate_multiplier": 1.0, "offered_rps": 29.0, "slo_attainment_pct": 85.0},
        {"point": 1, "rate_multiplier": 1.0, "offered_rps": 5.0, "slo_attainment_pct": 99.0},
    ]
    assert lowest_rate(runs, 0) == 28.5 and lowest_rate(runs, 2) is None
    assert goodput_label(0.0, "below", 28.5) == "<28.5"  # not "<0.0": an upper bound
    assert goodput_label(57.0, "above", 28.5) == ">=57.0"  # the highest rate: a lower bound
    assert goodput_label(31.4, None, 28.5) is None  # a crossing: shown as its value
