"""Per-request disaggregation through the lifecycle: a short prompt or a missing producer
takes the contract's same-worker path on a consumer (no producer leg, no transfer parameters),
everything else is prefilled remotely as by default, and every path shows in the decision log
and the route counts."""

from __future__ import annotations

from typing import Any

from narwhal.core.config import parse_config
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.records import RequestRecord
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    Decode,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
)

P0, D0, D1 = "http://p0", "http://d0", "http://d1"


def setup(max_attempts: int = 1, **routing: Any):  # type: ignore[no-untyped-def]
    config = parse_config(
        {
            "engine": {"first_token_timeout_s": 1.0, "request_timeout_s": 30.0},
            "recovery": {"max_attempts": max_attempts, "probe_interval_s": 4.0},
            "routing": routing,
            "engines": [
                {"url": P0, "role": "prefill"},
                {"url": D0, "role": "decode"},
                {"url": D1, "role": "decode"},
            ],
        }
    )
    clock = VirtualClock()
    records: list[RequestRecord] = []
    policies = Policies(config, seed=4, on_record=records.append)
    return clock, policies, records


def serve(
    clock: VirtualClock,
    policies: Policies,
    prompt: str,
    scripts: dict[str, list[Any]] | None = None,
) -> tuple[RecordingSink, ScriptedTransport]:
    transport = ScriptedTransport(clock, scripts or {})
    sink = RecordingSink()
    body = {
        "prompt": prompt,
        "max_tokens": 2,
        "stream": True,
        "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "evil.example"},
    }
    request = parse_client_request(COMPLETIONS, body, request_id="r1", arrival=clock.now())
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    return sink, transport


def test_a_short_prompt_is_prefilled_by_its_consumer_with_no_transfer_parameters() -> None:
    clock, policies, records = setup(remote_prefill_min_tokens=10)
    sink, transport = serve(clock, policies, "x" * 9)
    assert sink.status == 200
    ((url, kind, _path, body, _),) = transport.calls  # one leg: the consumer's
    assert url in (D0, D1) and kind == "STREAM"
    assert body is not None and "kv_transfer_params" not in body and body["prompt"] == "x" * 9
    (record,) = records
    assert record.engines == (url,) and record.ttft_s is None and record.first_byte_s is not None
    local = [d.as_dict() for d in policies.log.entries if d.kind == "prefill_local"]
    assert local == [
        {
            "t": local[0]["t"],
            "kind": "prefill_local",
            "engine": url,
            "reason": "short_prompt",
            "request": "r1",
        }
    ]
    assert policies.placement.prefill_routes.as_dict() == {
        "remote": 0,
        "short_prompt": 1,
        "no_producer": 0,
        "producer_failed": 0,
    }
    assert policies.placement.in_flight() == 0 and transport.released == []


def test_a_prompt_at_the_minimum_is_prefilled_remotely() -> None:
    clock, policies, records = setup(remote_prefill_min_tokens=10)
    sink, transport = serve(clock, policies, "x" * 10)
    assert sink.status == 200
    assert next(c[0] for c in transport.calls) == P0
    decode = transport.calls[1][3]
    assert decode is not None and decode["kv_transfer_params"]["remote_engine_id"] == "eng-p0"
    assert records[0].ttft_s is not None
    assert policies.placement.prefill_routes.remote == 1
    assert not [d for d in policies.log.entries if d.kind == "prefill_local"]


def producer_down(clock: VirtualClock, policies: Policies) -> None:
    policies.breaker.on_health(P0, clock.now(), ok=False)


def test_no_placeable_producer_fails_with_503_by_default() -> None:
    clock, policies, records = setup()
    producer_down(clock, policies)
    sink, transport = serve(clock, policies, "x" * 50)
    assert sink.status == 503 and "retry-after" in sink.headers
    assert transport.calls == [] and records[0].status == 503


def test_no_placeable_producer_with_local_is_served_by_a_consumer() -> None:
    clock, policies, records = setup(no_producer="local")
    producer_down(clock, policies)
    sink, transport = serve(clock, policies, "x" * 50)
    assert sink.status == 200 and records[0].status == 200
    ((url, kind, _, body, _),) = transport.calls
    assert url in (D0, D1) and kind == "STREAM" and body is not None
    assert "kv_transfer_params" not in body
    (decision,) = [d.as_dict() for d in policies.log.entries if d.kind == "prefill_local"]
    assert decision["reason"] == "no_producer" and decision["engine"] == url
    assert policies.placement.prefill_routes.no_producer == 1


def test_with_local_a_producer_in_service_still_prefills() -> None:
    clock, policies, _ = setup(no_producer="local")
    sink, transport = serve(clock, policies, "x" * 50)
    assert sink.status == 200 and transport.calls[0][0] == P0


def test_a_failed_local_prefill_is_charged_to_its_consumer_and_retried_on_another() -> None:
    clock, policies, records = setup(max_attempts=2, remote_prefill_min_tokens=100)
    first = policies.placement.choose("decode", clock.now())  # the seeded first pick, replayed
    clock, policies, records = setup(max_attempts=2, remote_prefill_min_tokens=100)
    sink, transport = serve(clock, policies, "short", {first or "": [Decode(status=500)]})
    assert sink.status == 200 and records[0].attempts == 2
    engines = [c[0] for c in transport.calls]
    assert engines[0] == first and engines[1] != first and P0 not in engines
    assert policies.breaker.health(first or "").streak == 1
    assert policies.placement.prefill_routes.short_prompt == 2
