"""``[routing] prefill_fallback``: when every producer attempt a request may make has failed, the
consumer prefills the prompt itself (no transfer parameters), the producers stay charged for
their faults and the consumer only for its own leg; "none" (the default) answers the fault as
before. Scripted engines on a virtual clock, through the one lifecycle."""

from __future__ import annotations

from typing import Any

from narwhal.core.config import parse_config
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.records import RequestRecord
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    Decode,
    Prefill,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
)

P0, D0 = "http://p0", "http://d0"


def setup(
    fallback: str, max_attempts: int = 1, eject_after: int = 3
) -> tuple[VirtualClock, Policies, list[RequestRecord]]:
    config = parse_config(
        {
            "engine": {
                "first_token_timeout_s": 1.0,
                "request_timeout_s": 30.0,
                "max_handoff_age_s": 5.0,
            },
            "recovery": {
                "max_attempts": max_attempts,
                "eject_after": eject_after,
                "retry_budget_min": 5,
                "panic_threshold_percent": 0,  # an ejected producer is not placed in panic
            },
            "routing": {"prefill_fallback": fallback},
            "engines": [{"url": P0, "role": "prefill"}, {"url": D0, "role": "decode"}],
        }
    )
    records: list[RequestRecord] = []
    return VirtualClock(), Policies(config, seed=3, on_record=records.append), records


def serve(
    clock: VirtualClock, policies: Policies, scripts: dict[str, list[Any]]
) -> tuple[RecordingSink, ScriptedTransport]:
    transport = ScriptedTransport(clock, scripts)
    sink = RecordingSink()
    body = {
        "prompt": "hello there",
        "max_tokens": 2,
        "stream": True,
        "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "evil.example"},
    }
    request = parse_client_request(COMPLETIONS, body, request_id="r1", arrival=clock.now())
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    return sink, transport


def fallbacks(policies: Policies) -> list[dict[str, Any]]:
    return [d.as_dict() for d in policies.log.entries if d.kind == "prefill_local"]


def test_by_default_a_failed_producer_answers_its_fault_and_no_consumer_is_asked() -> None:
    clock, policies, records = setup("none")
    sink, transport = serve(clock, policies, {P0: [Prefill(status=500)]})
    assert sink.status == 502
    assert [c[0] for c in transport.calls] == [P0]
    assert records[0].prefill_fallback is False and records[0].attempts == 1
    assert policies.placement.prefill_routes.producer_failed == 0 and fallbacks(policies) == []


def test_with_local_the_consumer_prefills_after_the_producer_fails() -> None:
    clock, policies, records = setup("local")
    sink, transport = serve(clock, policies, {P0: [Prefill(status=500)]})
    assert sink.status == 200
    assert b"".join(sink.sse_events()).count(b'"text"') == 2  # both tokens reached the client
    (producer_call, consumer_call) = transport.calls
    assert producer_call[0] == P0 and consumer_call[0] == D0 and consumer_call[1] == "STREAM"
    decode_body = consumer_call[3]
    assert decode_body is not None and "kv_transfer_params" not in decode_body  # no handoff
    (record,) = records
    assert record.status == 200 and record.prefill_fallback is True and record.attempts == 2
    assert record.engines == (P0, D0) and record.ttft_s is not None
    assert policies.breaker.health(P0).streak == 1  # the producer is charged as before
    assert policies.breaker.health(D0).streak == 0  # the consumer only for its own leg
    assert policies.placement.prefill_routes.producer_failed == 1
    (decision,) = fallbacks(policies)
    assert decision["reason"] == "producer_failed" and decision["engine"] == D0
    assert policies.placement.in_flight() == 0


def test_retries_go_to_producers_first_and_the_fallback_comes_last() -> None:
    clock, policies, records = setup("local", max_attempts=2)
    hung = Prefill(hang=True)  # the leg times out at max_handoff_age_s
    sink, transport = serve(clock, policies, {P0: [Prefill(connect="refused"), hung]})
    assert sink.status == 200
    assert [c[0] for c in transport.calls] == [P0, P0, D0]
    assert records[0].attempts == 3 and records[0].prefill_fallback is True
    assert policies.breaker.health(P0).streak == 2


def test_a_retry_that_finds_no_producer_falls_back() -> None:
    clock, policies, records = setup("local", max_attempts=2, eject_after=1)
    sink, transport = serve(clock, policies, {P0: [Prefill(status=500)]})
    assert sink.status == 200 and policies.breaker.health(P0).ejected_since is not None
    assert [c[0] for c in transport.calls] == [P0, D0]
    assert records[0].prefill_fallback is True and records[0].attempts == 2


def test_a_consumer_fault_of_the_fallback_is_the_consumers_and_ends_the_request() -> None:
    clock, policies, records = setup("local")
    sink, _ = serve(clock, policies, {P0: [Prefill(status=500)], D0: [Decode(status=500)]})
    assert sink.status == 502 and records[0].prefill_fallback is True
    assert policies.breaker.health(D0).streak == 1 and policies.breaker.health(P0).streak == 1


def test_no_fallback_for_a_request_fault_a_deadline_or_a_consumer_fault() -> None:
    clock, policies, records = setup("local")
    sink, transport = serve(clock, policies, {P0: [Prefill(status=400)]})
    assert sink.status == 400 and [c[0] for c in transport.calls] == [P0]  # passed through
    sink, transport = serve(clock, policies, {D0: [Decode(status=500)]})
    assert sink.status == 502 and [c[0] for c in transport.calls] == [P0, D0]  # decode failed
    assert [r.prefill_fallback for r in records] == [False, False]
    assert fallbacks(policies) == []


def test_no_fallback_once_the_deadline_passed_during_prefill() -> None:
    config = parse_config(
        {
            "engine": {"request_timeout_s": 2.0, "max_handoff_age_s": 5.0},
            "routing": {"prefill_fallback": "local"},
            "engines": [{"url": P0, "role": "prefill"}, {"url": D0, "role": "decode"}],
        }
    )
    records: list[RequestRecord] = []
    clock = VirtualClock()
    policies = Policies(config, seed=3, on_record=records.append)
    sink, transport = serve(clock, policies, {P0: [Prefill(hang=True)]})
    assert sink.status == 504 and [c[0] for c in transport.calls] == [P0]
    assert records[0].prefill_fallback is False
