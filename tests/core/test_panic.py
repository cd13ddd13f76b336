"""The panic threshold: a role of one or two engines never goes dark while an engine could
serve (Envoy's panic routing), and the breaker's own state is left as it was."""

from __future__ import annotations

import random

from narwhal.core.breaker import Breaker
from narwhal.core.config import RecoverySettings, Role, parse_config
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog
from tests.core.lifecycle_harness import D0, P0, serve_many
from tests.core.scripted import Decode

ROLES = {"http://p0": Role.PREFILL, "http://d0": Role.DECODE, "http://d1": Role.DECODE}


def fleet(threshold: int) -> tuple[Placement, Breaker, DecisionLog]:
    log = DecisionLog()
    recovery = RecoverySettings(
        eject_after=1, max_ejection_percent=100, panic_threshold_percent=threshold
    )
    breaker = Breaker(ROLES.items(), recovery, random.Random(0), log)
    return Placement(ROLES, breaker, random.Random(0), log), breaker, log


def eject(breaker: Breaker, url: str, now: float) -> None:
    assert breaker.on_failure(url, breaker.epoch(url), now, phase="decode")


def test_below_the_threshold_placement_spreads_over_the_ejected_engines() -> None:
    placement, breaker, log = fleet(50)
    eject(breaker, "http://d0", 0.0)  # 1 of 2 in service: 50%, not below 50
    assert {placement.choose("decode", 0.1) for _ in range(20)} == {"http://d1"}
    eject(breaker, "http://d1", 0.2)  # 0 of 2: panic
    chosen = {placement.choose("decode", 0.3) for _ in range(40)}
    assert chosen == {"http://d0", "http://d1"}
    assert placement.any_eligible("decode", 0.3)
    # the breaker is untouched: both still wait for a probe
    assert breaker.health("http://d0").ejected_since is not None
    panics = [(d.kind, dict(d.detail)) for d in log.entries if d.kind.startswith("panic")]
    assert panics == [("panic", {"engines": 2, "in_service": 0, "phase": "decode"})]


def test_panic_ends_when_an_engine_is_back_and_is_logged_once_each_way() -> None:
    placement, breaker, log = fleet(100)  # any engine out: panic
    eject(breaker, "http://d0", 0.0)
    for _ in range(5):
        placement.choose("decode", 0.1)
    (url,) = breaker.due_probes(1e9)
    from narwhal.core.breaker import ProbeOutcome

    breaker.on_probe(url, 1e9, ProbeOutcome.PASSED)
    placement.choose("decode", 1e9 + 1)
    kinds = [d.kind for d in log.entries if d.kind.startswith("panic")]
    assert kinds == ["panic", "panic_end"]


def test_an_engine_whose_health_check_failed_is_not_used_in_panic() -> None:
    placement, breaker, _ = fleet(50)
    breaker.on_health("http://d0", 0.0, ok=False)  # down: connection refused, say
    eject(breaker, "http://d1", 0.1)
    assert {placement.choose("decode", 0.2) for _ in range(20)} == {"http://d1"}
    breaker.on_health("http://d1", 0.3, ok=False)
    assert placement.choose("decode", 0.4) is None
    assert not placement.any_eligible("decode", 0.4)


def test_zero_turns_panic_off() -> None:
    placement, breaker, log = fleet(0)
    eject(breaker, "http://d0", 0.0)
    eject(breaker, "http://d1", 0.0)
    assert placement.choose("decode", 0.1) is None
    assert not [d for d in log.entries if d.kind == "panic"]


def test_a_lone_consumer_ejected_for_stalls_still_serves_the_next_request() -> None:
    """The issue's case: one consumer, ejected after its failures, healthy again: the next
    request is served by it instead of a 503 while its probe waits."""
    cfg = parse_config(
        {
            "recovery": {"eject_after": 2},
            "engines": [{"url": P0, "role": "prefill"}, {"url": D0, "role": "decode"}],
        }
    )
    scripts = {"decode": [Decode(connect="refused")] * 2}
    statuses, policies = serve_many(cfg, scripts, 3, stream=False)
    assert statuses == [502, 502, 200]
    assert policies.breaker.health(D0).ejected_since is not None  # still awaits its probe
    assert "panic" in [d.kind for d in policies.log.entries]
