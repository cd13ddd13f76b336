"""Reloads through Policies.reconfigure: joining, draining, kept state, refusals, at exact times."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.breaker import EngineState, ProbeOutcome
from narwhal.core.config import NarwhalConfig, parse_config
from narwhal.core.fleet_changes import changed_keys, refusals
from narwhal.core.policies import Policies

P, A, B = "http://p:1", "http://a:1", "http://b:1"


def config(*engines: tuple[str, str], **sections: Any) -> NarwhalConfig:
    data: dict[str, Any] = {"engines": [{"url": url, "role": role} for url, role in engines]}
    data.update(sections)
    return parse_config(data)


def fleet(**sections: Any) -> Policies:
    return Policies(config((P, "prefill"), (A, "decode"), **sections), seed=1)


def kinds(policies: Policies) -> list[str]:
    return [d.kind for d in policies.log.entries]


def join(policies: Policies, url: str, now: float) -> None:
    """Run the probe the maintenance loop would run for a joining ``url``, passing."""
    assert url in policies.breaker.due_probes(now)
    policies.breaker.on_probe(url, now, ProbeOutcome.PASSED)


def test_an_added_engine_is_not_placeable_until_its_probe_passes() -> None:
    policies = fleet()
    outcome = policies.reconfigure(config((P, "prefill"), (A, "decode"), (B, "decode")), 10.0)
    assert outcome.applied and outcome.added == (B,)
    breaker, placement = policies.breaker, policies.placement
    assert breaker.state(B, 10.0) is EngineState.JOINING
    assert placement.candidates("decode", 10.0) == [A]
    for _ in range(20):
        assert placement.choose("decode", 10.0) == A
    assert breaker.due_probes(10.0) == [B]  # probed at once, at the reload's own time
    breaker.on_probe(B, 10.5, ProbeOutcome.FAILED)
    assert breaker.state(B, 10.5) is EngineState.JOINING  # a failed probe: still out
    due = breaker.health(B).next_probe_at
    assert due is not None and due > 10.5
    assert breaker.due_probes(due - 1e-9) == []  # the normal backoff, to the boundary
    assert breaker.due_probes(due) == [B]
    breaker.on_probe(B, due, ProbeOutcome.PASSED)
    assert breaker.state(B, due) is EngineState.READY
    assert placement.candidates("decode", due) == [A, B]
    assert "join" in kinds(policies) and "readmit" not in kinds(policies)


def test_a_removed_engine_gets_no_placement_finishes_what_it_holds_then_is_gone() -> None:
    policies = fleet()
    placement, breaker = policies.placement, policies.breaker
    held = placement.reserve(A, "decode", 1.0, "req-1")  # a stream in flight on A
    outcome = policies.reconfigure(config((P, "prefill"), (B, "decode")), 2.0)
    assert outcome.removed == (A,) and outcome.forgotten == ()
    assert breaker.state(A, 2.0) is EngineState.DRAINING
    assert placement.choose("decode", 2.0) is None  # B still joining, A draining: no consumer
    join(policies, B, 2.0)
    for _ in range(20):
        assert placement.choose("decode", 3.0) == B
    # the stream in flight finishes on A: its result is still taken, nothing breaks
    breaker.on_success(A, held.epoch, 4.0, phase="decode")
    assert policies.settle(4.0) == []  # the reservation is not released yet
    held.release()
    assert policies.settle(5.0) == [A]
    assert A not in breaker.urls and A not in placement.counts
    assert [url for url, _ in policies.engines_known()] == [P, B]
    assert "forget" in kinds(policies)


def test_a_removed_engine_holding_nothing_is_forgotten_at_once() -> None:
    policies = fleet()
    outcome = policies.reconfigure(config((P, "prefill"), (B, "decode")), 2.0)
    assert outcome.forgotten == (A,)
    assert A not in policies.breaker.urls


def test_a_draining_engine_being_probed_is_kept_until_the_probe_ends() -> None:
    policies = fleet(recovery={"eject_after": 1})
    breaker = policies.breaker
    breaker.on_failure(A, breaker.epoch(A), 1.0, phase="decode")
    assert breaker.due_probes(1.0) == [A]  # a whole wave: probed at once
    new = config((P, "prefill"), (B, "decode"), recovery={"eject_after": 1})
    outcome = policies.reconfigure(new, 2.0)
    assert outcome.removed == (A,) and outcome.forgotten == ()
    breaker.on_probe(A, 3.0, ProbeOutcome.PASSED)  # leaving: the pass readmits nothing
    assert breaker.state(A, 3.0) is EngineState.DRAINING
    assert policies.settle(3.0) == [A]


def test_an_unchanged_engine_keeps_its_failure_streak_and_its_ejection() -> None:
    recovery = {"eject_after": 3, "max_ejection_percent": 100}
    policies = Policies(
        config((P, "prefill"), (A, "decode"), (B, "decode"), recovery=recovery), seed=1
    )
    breaker = policies.breaker
    for t in (1.0, 2.0):
        breaker.on_failure(A, breaker.epoch(A), t, phase="decode")
    for t in (1.0, 2.0, 3.0):
        breaker.on_failure(B, breaker.epoch(B), t, phase="decode")
    assert breaker.state(B, 3.0) is EngineState.EJECTED
    epochs = (breaker.epoch(A), breaker.epoch(B))
    new = config(
        (P, "prefill"), (A, "decode"), (B, "decode"), ("http://c:1", "decode"), recovery=recovery
    )
    assert policies.reconfigure(new, 4.0).applied
    assert breaker.health(A).streak == 2 and breaker.state(A, 4.0) is EngineState.READY
    assert breaker.state(B, 4.0) is EngineState.EJECTED
    assert breaker.health(B).ejected_since == 3.0
    assert (breaker.epoch(A), breaker.epoch(B)) == epochs
    assert breaker.on_failure(A, breaker.epoch(A), 5.0, phase="decode")  # the third: ejected


def test_a_change_to_a_fixed_section_is_refused_naming_the_key_and_changes_nothing() -> None:
    policies = fleet()
    before = policies.config
    new = config((P, "prefill"), (B, "decode"), recovery={"eject_after": 5})
    outcome = policies.reconfigure(new, 1.0)
    assert outcome.result == "refused" and not outcome.applied
    assert outcome.problems == (
        "recovery.eject_after: not reloadable (restart the router to change it)",
    )
    assert "recovery.eject_after" in outcome.summary()
    assert policies.config is before
    assert policies.breaker.urls == [P, A] and policies.placement.candidates("decode", 1.0) == [A]
    decision = policies.log.entries[-1].as_dict()
    assert decision["kind"] == "reload" and decision["result"] == "refused"


def test_a_role_change_is_refused() -> None:
    policies = fleet()
    outcome = policies.reconfigure(config((P, "prefill"), (A, "both")), 1.0)
    assert outcome.result == "refused"
    assert outcome.problems[0].startswith("engines[1].role: http://a:1 is a 'decode' engine")
    assert policies.breaker.health(A).role.value == "decode"


def test_an_invalid_file_is_recorded_and_ignored() -> None:
    policies = fleet()
    before = policies.config
    outcome = policies.reload_invalid("engines[0].url: must be an http(s) URL", 1.0)
    assert outcome.result == "invalid" and policies.config is before
    assert outcome.summary().startswith("invalid, keeping the previous configuration: engines[0]")
    decision = policies.log.entries[-1].as_dict()
    assert (decision["kind"], decision["result"]) == ("reload", "invalid")


def test_the_same_configuration_is_unchanged() -> None:
    policies = fleet()
    assert policies.reconfigure(config((P, "prefill"), (A, "decode")), 1.0).result == "unchanged"


def test_timeouts_and_kv_endpoints_reload_for_requests_that_start_after() -> None:
    policies = fleet()
    new = parse_config(
        {
            "engine": {"first_token_timeout_s": 7.0},
            "client": {"write_timeout_s": 3.0},
            "engines": [
                {"url": P, "role": "prefill", "kv_endpoint": "10.0.0.1:5559"},
                {"url": A, "role": "decode"},
            ],
        }
    )
    outcome = policies.reconfigure(new, 1.0)
    assert outcome.changed == (
        "engine.first_token_timeout_s",
        "client.write_timeout_s",
        f"kv_endpoint of {P}",
    )
    assert policies.config.engine.first_token_timeout_s == 7.0
    assert policies.pinned_side_channel(P) == "10.0.0.1:5559"


def test_an_engine_listed_again_while_it_drains_stays_with_its_state() -> None:
    policies = fleet()
    breaker = policies.breaker
    breaker.on_failure(A, breaker.epoch(A), 1.0, phase="decode")
    held = policies.placement.reserve(A, "decode", 1.0, "req-1")
    assert policies.reconfigure(config((P, "prefill"), (B, "decode")), 2.0).applied
    outcome = policies.reconfigure(config((P, "prefill"), (A, "decode"), (B, "decode")), 3.0)
    assert outcome.kept == (A,) and outcome.added == ()
    assert breaker.state(A, 3.0) is EngineState.READY and breaker.health(A).streak == 1
    assert policies.placement.choose("decode", 3.0) == A  # B still joining
    held.release()
    assert policies.settle(4.0) == []


def test_a_failure_on_a_draining_engine_changes_nothing() -> None:
    policies = fleet(recovery={"eject_after": 1})
    breaker = policies.breaker
    held = policies.placement.reserve(A, "decode", 1.0, "req-1")
    new = config((P, "prefill"), (B, "decode"), recovery={"eject_after": 1})
    assert policies.reconfigure(new, 2.0).applied
    assert not breaker.on_failure(A, held.epoch, 3.0, phase="decode")
    assert breaker.state(A, 3.0) is EngineState.DRAINING and breaker.health(A).streak == 0


def test_removing_the_last_ready_member_starts_a_whole_wave_probe_of_the_rest() -> None:
    policies = Policies(
        config((P, "prefill"), (A, "decode"), (B, "decode"), recovery={"eject_after": 1}),
        seed=1,
    )
    breaker = policies.breaker
    breaker.on_failure(B, breaker.epoch(B), 1.0, phase="decode")
    due = breaker.health(B).next_probe_at
    assert due is not None and due > 2.0 and breaker.due_probes(2.0) == []
    new = config((P, "prefill"), (B, "decode"), recovery={"eject_after": 1})
    assert policies.reconfigure(new, 2.0).applied
    assert breaker.due_probes(2.0) == [B]  # B is the whole role now: probed at once


def test_a_joining_engine_does_not_count_toward_the_ejection_cap() -> None:
    engines = [(P, "prefill"), (A, "decode"), (B, "decode")]
    recovery = {"eject_after": 1, "max_ejection_percent": 50}
    policies = Policies(config(*engines, recovery=recovery), seed=1)
    more = config(*engines, ("http://c:1", "decode"), ("http://d:1", "decode"), recovery=recovery)
    assert policies.reconfigure(more, 1.0).applied
    breaker = policies.breaker
    assert breaker.on_failure(A, breaker.epoch(A), 2.0, phase="decode")  # 1 of 2 members
    assert not breaker.on_failure(B, breaker.epoch(B), 2.0, phase="decode")  # capped at 50%
    assert breaker.state(B, 2.0) is EngineState.CAPPED


@pytest.mark.parametrize("routing", ["round_robin", "prefix_affinity", "least_loaded"])
def test_every_routing_policy_places_on_a_joined_engine(routing: str) -> None:
    policies = fleet(routing={"decode": routing})
    more = config((P, "prefill"), (A, "decode"), (B, "decode"), routing={"decode": routing})
    assert policies.reconfigure(more, 1.0).applied
    join(policies, B, 1.0)
    chosen = set()
    for i in range(20):
        url = policies.placement.choose("decode", 2.0 + i)
        assert url is not None
        chosen.add(url)
        policies.placement.reserve(url, "decode", 2.0 + i, f"req-{i}")
    assert B in chosen
    fewer = config((P, "prefill"), (B, "decode"), routing={"decode": routing})
    assert policies.reconfigure(fewer, 30.0).applied
    assert all(policies.placement.choose("decode", 31.0) == B for _ in range(5))


def test_refusals_and_changed_keys_name_dotted_paths() -> None:
    old = config((P, "prefill"), (A, "decode"))
    new = config(
        (P, "prefill"),
        (A, "decode"),
        routing={"least_loaded": {"waiting_weight": 2.0}},
        engine_contract={"model": "m", "vllm_version": "0.1"},
    )
    assert changed_keys(old, new, "routing") == ["routing.least_loaded.waiting_weight"]
    assert [p.split(":")[0] for p in refusals(new, old, {})] == [
        "routing.least_loaded.waiting_weight",
        "engine_contract",
    ]


def test_every_section_is_either_reloadable_or_refused() -> None:
    """A section added to the configuration must be classified, or a reload would silently
    keep its old value while reporting success."""
    from narwhal.core.config import NarwhalConfig
    from narwhal.core.fleet_changes import FIXED_SECTIONS, RELOADABLE_SECTIONS

    assert set(RELOADABLE_SECTIONS) | set(FIXED_SECTIONS) == set(NarwhalConfig.model_fields)
    assert not set(RELOADABLE_SECTIONS) & set(FIXED_SECTIONS)
