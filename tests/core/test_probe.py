"""Probes and health checks: readmission only after real inference, inconclusive probes."""

from __future__ import annotations

import json

from narwhal.core.breaker import EngineState, ProbeOutcome
from narwhal.core.config import parse_config
from narwhal.core.policies import Policies
from narwhal.core.ports import Reply
from narwhal.core.probe import check_health, maintenance_loop, probe_engine, run_probe
from tests.core.scripted import (
    DONE,
    Decode,
    Prefill,
    ScriptedTransport,
    VirtualClock,
    descriptor,
    make_ports,
    run,
    token,
)

P0, P1, D0 = "http://p0", "http://p1", "http://d0"


def setup(  # type: ignore[no-untyped-def]
    contract: bool = False, scripts: dict | None = None, recovery: dict | None = None
):
    data: dict = {
        "engine": {"first_token_timeout_s": 1.0},
        "recovery": {"eject_after": 1, "probe_interval_s": 2.0, **(recovery or {})},
        "engines": [
            {"url": P0, "role": "prefill"},
            {"url": P1, "role": "prefill"},
            {"url": D0, "role": "decode"},
        ],
    }
    if contract:
        data["engine_contract"] = {"model": "tiny-llama", "vllm_version": "0.32.0"}
    clock = VirtualClock()
    transport = ScriptedTransport(clock, scripts or {})
    policies = Policies(parse_config(data), seed=5)
    return clock, transport, policies, make_ports(clock, transport)


def eject(policies: Policies, url: str, now: float, producer: str | None = None) -> None:
    assert policies.breaker.on_failure(
        url, policies.breaker.epoch(url), now, producer=producer, phase="decode"
    )


def test_producer_probe_is_a_prefill_leg() -> None:
    _clock, transport, policies, ports = setup()
    assert run(probe_engine(P0, ports, policies)) is ProbeOutcome.PASSED
    ((url, _, path, body, _),) = transport.calls
    assert (url, path) == (P0, "/v1/completions")
    assert body is not None and body["max_tokens"] == 1 and body["stream"] is False
    assert transport.released and transport.released[0][0] == P0


def test_consumer_probe_uses_a_fresh_handoff_from_the_original_producer() -> None:
    clock, transport, policies, ports = setup()
    eject(policies, D0, clock.now(), producer=P1)
    (url,) = policies.breaker.due_probes(clock.now() + 10)
    assert url == D0
    assert run(run_probe(D0, ports, policies)) is ProbeOutcome.PASSED
    assert transport.calls[0][0] == P1  # the original producer made the handoff
    decode = transport.calls[1][3]
    assert decode is not None and decode["kv_transfer_params"] == descriptor()
    assert policies.breaker.state(D0, clock.now()) is EngineState.READY


def test_a_consumer_that_refuses_the_probe_never_got_its_handoff_so_it_is_released() -> None:
    clock, transport, policies, ports = setup(scripts={D0: [Decode(connect="refused")]})
    eject(policies, D0, clock.now(), producer=P1)
    assert run(probe_engine(D0, ports, policies)) is ProbeOutcome.FAILED
    assert [url for url, _ in transport.released] == [P1]
    transport.released.clear()
    assert run(probe_engine(D0, ports, policies)) is ProbeOutcome.PASSED
    assert transport.released == []  # delivered: the consumer pulled it


def test_consumer_probe_inconclusive_when_its_producer_fails() -> None:
    clock, _transport, policies, ports = setup(scripts={P1: [Prefill(connect="refused")]})
    eject(policies, D0, clock.now(), producer=P1)
    policies.breaker.due_probes(clock.now() + 10)
    assert run(run_probe(D0, ports, policies)) is ProbeOutcome.INCONCLUSIVE
    assert policies.breaker.health(D0).failed_probes == 0
    assert policies.breaker.state(D0, clock.now()) is EngineState.EJECTED


def test_hung_consumer_fails_its_probe_within_first_token_timeout() -> None:
    clock, _transport, policies, ports = setup(scripts={D0: [Decode(items=(), end="hang")]})
    eject(policies, D0, clock.now(), producer=P0)
    start = clock.now()
    policies.breaker.due_probes(start + 10)
    assert run(run_probe(D0, ports, policies)) is ProbeOutcome.FAILED
    assert clock.now() - start <= 1.0 + 0.05 + 1e-9  # each leg bounded by first_token_timeout_s
    assert policies.breaker.state(D0, clock.now()) is EngineState.EJECTED


def test_hung_producer_fails_its_probe_within_first_token_timeout() -> None:
    clock, transport, policies, ports = setup(scripts={P0: [Prefill(hang=True)]})
    start = clock.now()
    assert run(probe_engine(P0, ports, policies)) is ProbeOutcome.FAILED
    assert clock.now() - start == 1.0  # the prefill leg's bound: first_token_timeout_s
    assert transport.released == []


def test_producer_probe_checks_the_pinned_side_channel() -> None:
    data = {
        "engines": [
            {"url": P0, "role": "prefill", "kv_endpoint": "127.0.0.1:5559"},
            {"url": D0, "role": "decode"},
        ]
    }
    clock = VirtualClock()
    moved = {P0: [Prefill(kv=descriptor(port=5560)), Prefill(kv=descriptor(port=5559))]}
    ports = make_ports(clock, ScriptedTransport(clock, moved))
    policies = Policies(parse_config(data), seed=5)
    assert run(probe_engine(P0, ports, policies)) is ProbeOutcome.FAILED
    assert run(probe_engine(P0, ports, policies)) is ProbeOutcome.PASSED


def both_fleet() -> tuple[VirtualClock, ScriptedTransport, Policies, object]:
    B0, B1 = "http://b0", "http://b1"
    data = {
        "engine": {"first_token_timeout_s": 1.0},
        "recovery": {"eject_after": 1},
        "engines": [{"url": B0, "role": "both"}, {"url": B1, "role": "both"}],
    }
    clock = VirtualClock()
    transport = ScriptedTransport(clock, {})
    return clock, transport, Policies(parse_config(data), seed=5), make_ports(clock, transport)


def test_both_engine_ejected_after_a_crossed_decode_is_probed_with_that_producers_handoff() -> None:
    clock, transport, policies, ports = both_fleet()
    eject(policies, "http://b1", clock.now(), producer="http://b0")
    assert run(probe_engine("http://b1", ports, policies)) is ProbeOutcome.PASSED
    (p_url, _, _, _, _), (d_url, kind, _, decode, _) = transport.calls
    assert (p_url, d_url, kind) == ("http://b0", "http://b1", "STREAM")
    assert decode is not None and decode["kv_transfer_params"] == descriptor()  # a real pull


def test_both_engine_ejected_for_its_own_legs_is_probed_on_them() -> None:
    clock, transport, policies, ports = both_fleet()
    eject(policies, "http://b1", clock.now())
    assert run(probe_engine("http://b1", ports, policies)) is ProbeOutcome.PASSED
    (p_url, _, _, _, _), (d_url, _, _, decode, _) = transport.calls
    assert (p_url, d_url) == ("http://b1", "http://b1")
    assert decode is not None and "kv_transfer_params" not in decode  # same-worker decode


def test_probe_needs_a_token_then_done() -> None:
    _, _, policies, ports = setup(scripts={D0: [Decode(items=((0.01, DONE),))]})
    assert run(probe_engine(D0, ports, policies)) is ProbeOutcome.FAILED
    _clock, _transport, policies, ports = setup(
        scripts={D0: [Decode(items=((0.01, token("A")), (0.01, DONE)))]}
    )
    assert run(probe_engine(D0, ports, policies)) is ProbeOutcome.PASSED


def test_consumer_probe_asks_for_probe_decode_tokens_and_fails_on_a_stall() -> None:
    stalls = Decode(items=((0.01, token("A")), (0.01, token("B")), (0.01, token("C"))), end="hang")
    clock, transport, policies, ports = setup(scripts={D0: [stalls]})
    eject(policies, D0, clock.now(), producer=P0)
    policies.breaker.due_probes(clock.now() + 10)
    start = clock.now()
    assert run(run_probe(D0, ports, policies)) is ProbeOutcome.FAILED  # 3 tokens, then silence
    assert clock.now() - start <= 1.0 + 0.05 + 1e-9  # the whole leg within first_token_timeout_s
    decode = transport.calls[1][3]
    assert decode is not None and decode["max_tokens"] == 8 and decode["stream"] is True
    assert policies.breaker.state(D0, clock.now()) is EngineState.EJECTED


def test_probe_decode_tokens_sets_the_consumer_probes_length() -> None:
    clock, transport, policies, ports = setup(recovery={"probe_decode_tokens": 3})
    eject(policies, D0, clock.now(), producer=P0)
    policies.breaker.due_probes(clock.now() + 10)
    assert run(run_probe(D0, ports, policies)) is ProbeOutcome.PASSED
    assert transport.calls[1][3]["max_tokens"] == 3


def test_contract_checked_on_readmission() -> None:
    _clock, transport, policies, ports = setup(contract=True)
    ok_models = Reply(200, json.dumps({"data": [{"id": "tiny-llama"}]}).encode())
    transport.get_replies[(P0, "/v1/models")] = ok_models
    transport.get_replies[(P0, "/version")] = Reply(200, b'{"version": "0.31.0"}')
    assert run(probe_engine(P0, ports, policies)) is ProbeOutcome.FAILED
    transport.get_replies[(P0, "/version")] = Reply(200, b'{"version": "0.32.0"}')
    assert run(probe_engine(P0, ports, policies)) is ProbeOutcome.PASSED


def test_health_check_marks_down_and_readmits_without_contract() -> None:
    clock, transport, policies, ports = setup()
    transport.get_replies[(P0, "/health")] = Prefill(connect="refused")
    assert not run(check_health(P0, ports, policies))
    assert policies.breaker.state(P0, clock.now()) is EngineState.EJECTED
    del transport.get_replies[(P0, "/health")]
    assert run(check_health(P0, ports, policies))
    assert policies.breaker.state(P0, clock.now()) is EngineState.READY


def test_maintenance_loop_spawns_due_probes_and_health_checks() -> None:
    clock, transport, policies, ports = setup()
    spawned: list = []
    ports.spawn = spawned.append
    eject(policies, D0, clock.now(), producer=P0)
    ticks = iter(range(100))
    run(maintenance_loop(ports, policies, stop=lambda: next(ticks) >= 8, tick_s=0.5))
    for factory in spawned:
        run(factory())
    kinds = [(d.kind, d.engine) for d in policies.log.entries]
    assert ("probe", D0) in kinds and ("readmit", D0) in kinds
    health_calls = [c for c in transport.calls if c[2] == "/health"]
    assert len(health_calls) >= 3  # every engine checked
