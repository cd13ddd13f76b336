"""The ``diffuse`` recipe marks the core's shipped defaults (its recommendation, a setting judged
by its worst case over the cases, is tested in test_recommendation)."""

from __future__ import annotations

from narwhal.core.config import RecoverySettings
from narwhal.experiments.figures.diffuse import shipped_default


def test_the_defaults_marked_are_the_cores() -> None:
    defaults = RecoverySettings()
    assert shipped_default("recovery.max_ejection_percent") == defaults.max_ejection_percent
    assert shipped_default("recovery.failure_quarantine_s") == defaults.failure_quarantine_s
    assert shipped_default("engine.first_token_timeout_s") == 30.0
    assert shipped_default("fleet.size") is None
    assert shipped_default("recovery.no_such_key") is None
