"""The tuning recipe's recommendation rule, and its refusal to pick among identical cells."""

from __future__ import annotations

from typing import Any

from narwhal.experiments.figures.tuning import goodput_label, lowest_rate, recommend


def _cell(success: float, p99: float, goodput: float | None) -> dict[str, Any]:
    return {"success_pct": success, "first_byte_p99_s": p99, "goodput_rps": goodput}


def test_capacity_then_success_then_p99() -> None:
    cells = [_cell(99.0, 0.5, 10.0), _cell(99.9, 0.9, 10.0), _cell(100.0, 0.1, 6.0)]
    # the third is best on success and p99 but costs 40% of the goodput: out at 5% tolerance
    assert recommend(cells, goodput_pct=5.0, success_pp=0.5) == 1
    assert recommend(cells, goodput_pct=5.0, success_pp=1.0) == 0  # 99.0 within 1 pp: lower p99
    assert recommend(cells, goodput_pct=50.0, success_pp=0.5) == 2


def test_identical_cells_get_no_recommendation() -> None:
    assert recommend([_cell(100.0, 0.2, 5.0)] * 4, goodput_pct=5.0, success_pp=0.5) is None
    assert recommend([_cell(100.0, 0.2, None)] * 2, goodput_pct=5.0, success_pp=0.5) is None
    almost = [_cell(100.0, 0.2, 5.0)] * 3 + [_cell(100.0, 0.3, 5.0)]
    assert recommend(almost, goodput_pct=5.0, success_pp=0.5) == 0


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
