"""Placement: eligibility, least-reserved choice, seeded ties, reservations released once; every
routing policy bound by the same eligibility, avoid rule and quarantine fallback."""

from __future__ import annotations

import random
from typing import get_args

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.breaker import Breaker
from narwhal.core.config import RecoverySettings, Role, RoutingPolicyName, RoutingSettings
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog
from narwhal.core.requests import COMPLETIONS, ClientRequest
from narwhal.core.routing.load import EngineLoad
from narwhal.core.routing.prefix import PrefixAffinity, block_hashes, rendered_prompt

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
            eject_after=eject_after,
            failure_quarantine_s=quarantine,
            max_ejection_percent=100,
            panic_threshold_percent=0,  # ejection alone here (panic: tests/core/test_panic.py)
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
        RecoverySettings(
            eject_after=1,
            failure_quarantine_s=2.0,
            max_ejection_percent=34,
            panic_threshold_percent=0,  # (1 of 3 in service would panic)
        ),
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


# ---------------------------------------------------------------- every routing policy alike

POLICY_NAMES = list(get_args(RoutingPolicyName))
SHARED_PROMPT = "a long system prompt that every engine may have seen " * 4


def routed(
    name: str, seed: int, max_ejection_percent: int = 100
) -> tuple[Placement, Breaker, DecisionLog]:
    log = DecisionLog()
    b = Breaker(
        ROLES.items(),
        RecoverySettings(
            eject_after=2,
            failure_quarantine_s=1.0,
            max_ejection_percent=max_ejection_percent,
            panic_threshold_percent=0,  # the eligible engines as the breaker says (no panic)
        ),
        random.Random(seed),
        log,
    )
    routing = RoutingSettings(prefill=name, decode=name)  # type: ignore[arg-type]
    return Placement(ROLES, b, random.Random(seed), log, routing, block_chain=chain), b, log


def chain(request: ClientRequest) -> list[bytes]:
    """kv_aware's block identity here: the router's own hashes of the rendered prompt."""
    return block_hashes(rendered_prompt(request), 16, 1024)


def test_the_default_policy_is_least_reserved_for_both_phases() -> None:
    p, _ = placement()
    assert {phase: policy.name for phase, policy in p.routing.items()} == {
        "prefill": "least_reserved",
        "decode": "least_reserved",
    }


@settings(derandomize=True, max_examples=400, deadline=None)
@given(
    name=st.sampled_from(POLICY_NAMES),
    phase=st.sampled_from(["prefill", "decode"]),
    loads=st.lists(st.integers(0, 3), min_size=len(URLS), max_size=len(URLS)),
    failures=st.lists(st.integers(0, 2), min_size=len(URLS), max_size=len(URLS)),
    cap=st.sampled_from([0, 50, 100]),
    now=st.sampled_from([0.5, 1.0]),
    avoid=st.sets(st.sampled_from(URLS)),
    seen=st.sets(st.sampled_from(URLS)),
    reported=st.lists(st.integers(0, 5), min_size=len(URLS), max_size=len(URLS)),
    seed=st.integers(0, 2**16),
)
def test_every_policy_keeps_to_the_eligible_engines(
    name: str,
    phase: str,
    loads: list[int],
    failures: list[int],
    cap: int,
    now: float,
    avoid: set[str],
    seen: set[str],
    reported: list[int],
    seed: int,
) -> None:
    """Breaker (ejection, quarantine, ejection cap), quarantine fallback and the retry's
    "avoid" rule bound every policy's choice the same way, whatever its own preferences: the
    engines an ineligible engine would win by (the lowest reported load, the longest prefix,
    the fewest reservations) are tempted with those on purpose."""
    p, b, log = routed(name, seed, cap)
    request = ClientRequest("r", COMPLETIONS, {"prompt": SHARED_PROMPT}, 0.0)
    serves = [u for u, r in ROLES.items() if (r.produces if phase == "prefill" else r.consumes)]
    for i, url in enumerate(URLS):
        p.counts[url][phase] = loads[i]
        p.report_load(url, EngineLoad(reported[i], 0, 0.0), 0.0)
        if url in seen and url in serves:
            p.routing[phase].placed(url, request, 0.0)  # it has the prompt's prefix
        for _ in range(failures[i]):  # 1: quarantined until 1.0; 2: ejected (unless capped)
            b.on_failure(url, b.epoch(url), 0.0, phase=phase)
    ready = [u for u in serves if b.placeable(u, now)]
    allowed = [u for u in ready if u not in avoid] or ready
    chosen = p.choose(phase, now, avoid, request)
    if allowed:
        assert chosen in allowed
        assert not fallbacks(log)
        return
    in_service = [u for u in serves if b.in_service(u)]
    if not in_service:
        assert chosen is None
        return
    # the fallback is placement's, the same for every policy: a quarantined engine before a
    # capped one, the quarantine that ends first, on an engine not avoided if there is one
    # (first in config order among equals)
    preferred = [u for u in in_service if u not in avoid] or in_service
    rank = {u: (b.health(u).capped, b.health(u).quarantined_until or now) for u in preferred}
    assert chosen == min(preferred, key=lambda u: rank[u])
    assert fallbacks(log) == [(chosen, phase)]


def test_an_engine_over_the_ejection_cap_is_placed_by_every_policy() -> None:
    for name in POLICY_NAMES:
        p, b, log = routed(name, seed=1, max_ejection_percent=0)
        for url in ("http://d0", "http://b0"):  # eject_after=2 reached by both
            for _ in range(2):
                b.on_failure(url, b.epoch(url), 0.0, phase="decode")
        # one engine of a role may always be ejected (d0); the cap keeps b0 in service
        assert [d.engine for d in log.entries if d.kind == "eject_capped"] == ["http://b0"]
        assert p.choose("decode", 0.5) == "http://b0", name  # quarantined: the fallback
        assert p.choose("decode", 1.0) == "http://b0", name  # capped: the last resort
        assert p.choose("decode", 1.0, avoid={"http://b0"}) == "http://b0", name


def test_the_request_reaches_the_policy() -> None:
    p, _, _ = routed("prefix_affinity", seed=0)
    request = ClientRequest("r", COMPLETIONS, {"prompt": SHARED_PROMPT}, 0.0)
    first = p.choose("prefill", 0.0, request=request)
    assert first is not None
    p.counts[first]["prefill"] = 1  # one reservation more than the others: within the guard
    assert [p.choose("prefill", 0.0, (), request) for _ in range(5)] == [first] * 5
    # the default request (None): the policy cannot match and falls back to least_reserved
    assert p.choose("prefill", 0.0) != first


def test_a_quarantine_fallback_is_told_to_the_policy() -> None:
    p, b, _ = routed("prefix_affinity", seed=0)
    request = ClientRequest("r", COMPLETIONS, {"prompt": SHARED_PROMPT}, 0.0)
    for url in ("http://d0", "http://b0"):
        b.on_failure(url, b.epoch(url), 0.0, phase="decode")  # both quarantined until 1.0
    assert p.choose("decode", 0.5, {"http://b0"}, request) == "http://d0"
    policy = p.routing["decode"]
    assert isinstance(policy, PrefixAffinity)
    assert policy.indexes["http://d0"].match(policy.chain(request)) > 0
    assert len(policy.indexes["http://b0"]) == 0


def test_load_reports_reach_least_loaded() -> None:
    p, _, _ = routed("least_loaded", seed=0)
    p.report_load("http://d0", EngineLoad(4, 0, 0.0), 0.0)
    p.report_load("http://b0", EngineLoad(0, 1, 0.0), 0.0)
    assert p.choose("decode", 0.0) == "http://b0"  # 1 < 4, whatever the reservations say
    p.counts["http://b0"]["decode"] = 9
    assert p.choose("decode", 1.0) == "http://b0"  # score 2 (its pick since the report) < 4
    # 10 s later both reports are stale: reservations decide
    assert p.choose("decode", 10.0) == "http://d0"
