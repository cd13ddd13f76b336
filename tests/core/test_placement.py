"""Placement: eligibility, least-reserved choice, seeded ties, reservations released once."""

from __future__ import annotations

import random

from narwhal.core.breaker import Breaker
from narwhal.core.config import RecoverySettings, Role
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog

ROLES = {
    "http://p0": Role.PREFILL,
    "http://p1": Role.PREFILL,
    "http://d0": Role.DECODE,
    "http://b0": Role.BOTH,
}


def placement(seed: int = 0, quarantine: float = 0.0) -> tuple[Placement, Breaker]:
    log = DecisionLog()
    b = Breaker(
        ROLES.items(),
        RecoverySettings(eject_after=1, failure_quarantine_s=quarantine),
        random.Random(seed),
        log,
    )
    return Placement(ROLES, b, random.Random(seed), log), b


def test_roles_decide_candidates() -> None:
    p, _ = placement()
    assert p.candidates("prefill", 0) == ["http://p0", "http://p1", "http://b0"]
    assert p.candidates("decode", 0) == ["http://d0", "http://b0"]


def test_least_reserved_wins_and_release_is_idempotent() -> None:
    p, _ = placement()
    r1 = p.reserve("http://p0", "prefill", 0, "r1")
    p.reserve("http://b0", "prefill", 0, "r2")
    assert p.choose("prefill", 0) == "http://p1"
    r1.release()
    r1.release()
    assert p.counts["http://p0"]["prefill"] == 0
    assert p.in_flight() == 1


def test_ties_follow_the_seed() -> None:
    picks = [placement(seed)[0].choose("prefill", 0) for seed in range(20)]
    assert picks == [placement(seed)[0].choose("prefill", 0) for seed in range(20)]
    assert len(set(picks)) > 1


def test_ejected_and_quarantined_engines_get_no_placement() -> None:
    p, b = placement(quarantine=1.0)
    b.on_failure("http://d0", b.epoch("http://d0"), 0.0, phase="decode")  # eject_after=1: ejected
    assert p.choose("decode", 0.0) == "http://b0"
    b.on_failure("http://b0", b.epoch("http://b0"), 0.0, phase="decode")
    assert p.choose("decode", 0.5) is None


def test_avoid_engines_that_failed_this_request_while_another_is_eligible() -> None:
    p, _ = placement()
    assert p.choose("decode", 0, avoid={"http://d0"}) == "http://b0"
    assert p.choose("decode", 0, avoid={"http://d0", "http://b0"}) in ("http://d0", "http://b0")
