"""The ``diffuse`` recipe's rule: a setting is judged by its worst case, then by its goodput;
the shipped defaults it marks are the core's."""

from __future__ import annotations

from narwhal.core.config import RecoverySettings
from narwhal.experiments.figures.diffuse import recommend, shipped_default

SETTINGS = [(25, 0.0), (50, 0.0), (100, 0.0)]


def test_the_best_worst_case_wins_over_the_best_average() -> None:
    # 100 is best on average but loses a third of the requests in one case
    success = {(25, 0.0): [70.0, 96.0], (50, 0.0): [90.0, 95.0], (100, 0.0): [66.0, 100.0]}
    goodput = {s: [10.0, 10.0] for s in SETTINGS}
    assert recommend(SETTINGS, success, goodput, 0.5) == (50, 0.0)


def test_within_the_tolerance_the_higher_goodput_wins_then_grid_order() -> None:
    success = {(25, 0.0): [90.0, 99.0], (50, 0.0): [90.4, 99.0], (100, 0.0): [89.0, 99.0]}
    goodput = {(25, 0.0): [10.0, 12.0], (50, 0.0): [10.0, 11.0], (100, 0.0): [20.0, 20.0]}
    assert recommend(SETTINGS, success, goodput, 0.5) == (25, 0.0)  # 100 is 1.4 pp worse
    tied = {s: [10.0, 10.0] for s in SETTINGS}
    assert recommend(SETTINGS, success, tied, 0.5) == (25, 0.0)
    assert recommend(SETTINGS, success, tied, 0.0) == (50, 0.0)


def test_the_defaults_marked_are_the_cores() -> None:
    defaults = RecoverySettings()
    assert shipped_default("recovery.max_ejection_percent") == defaults.max_ejection_percent
    assert shipped_default("recovery.failure_quarantine_s") == defaults.failure_quarantine_s
    assert shipped_default("engine.first_token_timeout_s") == 30.0
    assert shipped_default("fleet.size") is None
    assert shipped_default("recovery.no_such_key") is None
