"""Placement: eligibility, least-reserved choice, seeded ties, reservations released once."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

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
    p, b, _ = placement_with_log(seed, quarantine)
    return p, b


def placement_with_log(
    seed: int = 0, quarantine: float = 0.0, eject_after: int = 1
) -> tuple[Placement, Breaker, DecisionLog]:
    log = DecisionLog()
    b = Breaker(
        ROLES.items(),
        RecoverySettings(
            eject_after=eject_after, failure_quarantine_s=quarantine, max_ejection_percent=100
        ),
        random.Random(seed),
        log,
    )
    return Placement(ROLES, b, random.Random(seed), log), b, log


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


def test_ejected_engines_get_no_placement() -> None:
    p, b = placement(quarantine=1.0)
    b.on_failure("http://d0", b.epoch("http://d0"), 0.0, phase="decode")  # eject_after=1: ejected
    assert p.choose("decode", 0.0) == "http://b0"
    b.on_failure("http://b0", b.epoch("http://b0"), 0.0, phase="decode")
    assert p.choose("decode", 0.5) is None
    assert not p.any_eligible("decode", 0.5)


def fallbacks(log: DecisionLog) -> list[tuple[str | None, str]]:
    return [
        (d.engine, dict(d.detail)["phase"]) for d in log.entries if d.kind == "quarantine_fallback"
    ]


def test_a_quarantined_engine_is_avoided_while_another_is_ready() -> None:
    p, b, log = placement_with_log(quarantine=2.0, eject_after=5)
    b.on_failure("http://d0", b.epoch("http://d0"), 0.0, phase="decode")
    assert [p.choose("decode", 1.0) for _ in range(5)] == ["http://b0"] * 5
    assert p.choose("decode", 2.0) in ("http://d0", "http://b0")  # quarantine over at 2.0
    assert fallbacks(log) == []


def test_quarantine_never_empties_a_role() -> None:
    p, b, log = placement_with_log(quarantine=2.0, eject_after=5)
    b.on_failure("http://d0", b.epoch("http://d0"), 0.5, phase="decode")  # until 2.5
    b.on_failure("http://b0", b.epoch("http://b0"), 0.0, phase="decode")  # until 2.0
    assert p.candidates("decode", 1.0) == []
    assert p.any_eligible("decode", 1.0) and p.falls_back("decode", 1.0)
    assert p.choose("decode", 1.0) == "http://b0"  # its quarantine ends first
    assert p.choose("decode", 1.0, avoid={"http://b0"}) == "http://d0"  # not failed on here
    assert p.choose("decode", 1.0, avoid={"http://b0", "http://d0"}) == "http://b0"
    assert fallbacks(log) == [
        ("http://b0", "decode"),
        ("http://d0", "decode"),
        ("http://b0", "decode"),
    ]
    assert not p.falls_back("decode", 2.5)


def test_avoid_engines_that_failed_this_request_while_another_is_eligible() -> None:
    p, _ = placement()
    assert p.choose("decode", 0, avoid={"http://d0"}) == "http://b0"
    assert p.choose("decode", 0, avoid={"http://d0", "http://b0"}) in ("http://d0", "http://b0")
    # every eligible engine avoided: the choice among them still breaks ties by the seed
    everyone = {"http://d0", "http://b0"}
    picks = {placement(seed)[0].choose("decode", 0, avoid=everyone) for seed in range(20)}
    assert picks == everyone


URLS = list(ROLES)


@settings(derandomize=True, max_examples=300)
@given(
    phase=st.sampled_from(["prefill", "decode"]),
    loads=st.lists(st.integers(0, 3), min_size=len(URLS), max_size=len(URLS)),
    ejected=st.sets(st.sampled_from(URLS)),
    avoid=st.sets(st.sampled_from(URLS)),
    seed=st.integers(0, 2**16),
)
def test_choice_is_the_least_loaded_eligible_engine_preferring_those_not_avoided(
    phase: str, loads: list[int], ejected: set[str], avoid: set[str], seed: int
) -> None:
    p, b = placement(seed)
    for url, load in zip(URLS, loads, strict=True):
        p.counts[url][phase] = load
    for url in ejected:
        b.on_failure(url, b.epoch(url), 0.0, phase=phase)  # eject_after=1: ejected
    # the rule written out plainly, with an RNG of the same seed for ties
    serves = {u for u, r in ROLES.items() if (r.produces if phase == "prefill" else r.consumes)}
    eligible = [u for u in URLS if u not in ejected and u in serves]
    preferred = [u for u in eligible if u not in avoid] or eligible
    expected = None
    if preferred:
        least = min(p.counts[u][phase] for u in preferred)
        tied = [u for u in preferred if p.counts[u][phase] == least]
        expected = tied[0] if len(tied) == 1 else random.Random(seed).choice(tied)
    assert p.choose(phase, 0.0, avoid) == expected


def test_a_capped_engine_is_placed_only_when_no_quarantined_one_is_left() -> None:
    log = DecisionLog()
    roles = {"http://d0": Role.DECODE, "http://d1": Role.DECODE, "http://d2": Role.DECODE}
    b = Breaker(
        roles.items(),
        RecoverySettings(eject_after=1, failure_quarantine_s=2.0, max_ejection_percent=34),
        random.Random(0),
        log,
    )
    p = Placement(roles, b, random.Random(0), log)
    assert b.on_failure("http://d0", b.epoch("http://d0"), 0.0, phase="decode")  # ejected
    assert not b.on_failure("http://d1", b.epoch("http://d1"), 0.0, phase="decode")  # capped
    assert p.choose("decode", 0.5) == "http://d2"  # ready: neither fallback is used
    b.on_failure("http://d2", b.epoch("http://d2"), 0.5, phase="decode")  # capped too now
    b.on_success("http://d2", b.epoch("http://d2"), 0.6, phase="decode")  # ...then not
    assert p.choose("decode", 1.0) == "http://d2"  # quarantined until 2.5, before capped d1
    assert p.choose("decode", 1.0, avoid={"http://d2"}) == "http://d1"  # capped, not failed on
    assert p.choose("decode", 3.0) == "http://d2"  # ready again
