"""Tracing over real HTTP: a request span and one span per engine leg, collected by the
OpenTelemetry SDK's in-memory exporter, and the W3C ``traceparent`` each emulated engine got."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from narwhal.core.config import TracingSettings, parse_config
from narwhal.live.app import Router
from narwhal.live.serving import make_router_server
from narwhal.serving import BackgroundServer, bind, port_of
from tests.live.conftest import FAST_ENGINE, HTTP, Emulator, Servers

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from narwhal.live.tracing import RouterTracing, TracingUnavailable

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def start_traced_router(
    servers: Servers,
    exporter: InMemorySpanExporter,
    producer: Emulator,
    consumer: Emulator,
    *,
    enabled: bool = True,
    recovery: dict[str, Any] | None = None,
) -> tuple[Router, str]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = parse_config(
        {
            "engine": FAST_ENGINE,
            "recovery": {"probe_interval_s": 60.0, **(recovery or {})},
            "tracing": {"enabled": enabled},
            "engine_contract": {"model": "tiny-llama", "vllm_version": "0.32.0"},
            "engines": [
                {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
                {"url": consumer.url, "role": "decode"},
            ],
        }
    )
    router = Router(config, tick_s=0.02, tracer_provider=provider)
    sock = bind("127.0.0.1", 0)
    built = make_router_server(router, client=router.config.client, graceful_s=0.2)
    servers.start(BackgroundServer(built, [sock]))
    return router, f"http://127.0.0.1:{port_of(sock)}"


def spans_once(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The finished spans, once there are ``count`` of them (bounded wait)."""
    end = time.monotonic() + 5.0
    while len(exporter.get_finished_spans()) < count:
        assert time.monotonic() < end, f"spans: {exporter.get_finished_spans()}"
        time.sleep(0.01)
    return list(exporter.get_finished_spans())


def by_name(spans: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        named.setdefault(span.name, []).append(span)
    return named


def received(engine: Emulator) -> list[tuple[str, str]]:
    """(x-request-id, traceparent) of what the engine was sent."""
    return [(rid, tp) for rid, tp in engine.state()["traceparents"]]


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def completion(url: str, headers: dict[str, str] | None = None, **body: Any) -> Any:
    payload = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 3, "stream": True, **body}
    reply = HTTP.post(url + "/v1/completions", json=payload, headers=headers or {})
    return reply


@pytest.fixture
def pair(emulator: Callable[..., Emulator]) -> Iterator[tuple[Emulator, Emulator]]:
    yield emulator("prefill"), emulator("decode")


def test_a_request_span_has_a_child_per_leg_and_each_engine_gets_its_legs_trace(
    servers: Servers, exporter: InMemorySpanExporter, pair: tuple[Emulator, Emulator]
) -> None:
    producer, consumer = pair
    _, url = start_traced_router(servers, exporter, producer, consumer)
    reply = completion(url, {"X-Request-Id": "client-abc"})
    assert reply.status_code == 200 and "[DONE]" in reply.text
    named = by_name(spans_once(exporter, 3))
    (request,) = named["POST /v1/completions"]
    (prefill,), (decode,) = named["prefill"], named["decode"]
    assert request.attributes is not None
    assert {k: request.attributes[k] for k in (
        "narwhal.request_id", "http.route", "narwhal.model", "narwhal.outcome",
        "http.response.status_code", "narwhal.attempts", "narwhal.committed",
    )} == {
        "narwhal.request_id": "client-abc", "http.route": "/v1/completions",
        "narwhal.model": "tiny-llama", "narwhal.outcome": "ok",
        "http.response.status_code": 200, "narwhal.attempts": 1, "narwhal.committed": True,
    }  # fmt: skip
    trace_id, request_span = hex_ids(request)
    for leg, engine in ((prefill, producer), (decode, consumer)):
        assert leg.attributes is not None and leg.parent is not None
        assert f"{leg.parent.span_id:016x}" == request_span
        assert leg.attributes["narwhal.engine"] == engine.url
        assert leg.attributes["narwhal.attempt"] == 1
        assert leg.attributes["narwhal.outcome"] == "ok"
        leg_trace, leg_span = hex_ids(leg)
        assert leg_trace == trace_id
        # the engine got this leg's context: same trace, the leg's span as parent
        ((request_id, traceparent),) = received(engine)
        assert request_id == leg.attributes["narwhal.backend_request_id"]
        assert request_id.startswith("client-abc-")
        version, sent_trace, sent_parent, _flags = traceparent.split("-")
        assert (version, sent_trace, sent_parent) == ("00", trace_id, leg_span)
    assert prefill.end_time is not None and decode.start_time is not None
    assert prefill.end_time <= decode.start_time  # the decode leg starts after the prefill


def test_a_clients_traceparent_is_continued(
    servers: Servers, exporter: InMemorySpanExporter, pair: tuple[Emulator, Emulator]
) -> None:
    producer, consumer = pair
    _, url = start_traced_router(servers, exporter, producer, consumer)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
    assert completion(url, {"traceparent": traceparent}, stream=False).status_code == 200
    (request,) = by_name(spans_once(exporter, 3))["POST /v1/completions"]
    assert hex_ids(request)[0] == CLIENT_TRACE
    assert request.parent is not None and f"{request.parent.span_id:016x}" == CLIENT_PARENT
    ((_, sent),) = received(consumer)
    assert sent.startswith(f"00-{CLIENT_TRACE}-")


def test_a_retried_request_shows_both_attempts(
    servers: Servers, exporter: InMemorySpanExporter, pair: tuple[Emulator, Emulator]
) -> None:
    producer, consumer = pair
    consumer.faults({"kind": "http_5xx", "count": 1})
    _, url = start_traced_router(
        servers, exporter, producer, consumer, recovery={"max_attempts": 2}
    )
    assert completion(url).status_code == 200
    named = by_name(spans_once(exporter, 5))
    (request,) = named["POST /v1/completions"]
    assert request.attributes is not None and request.attributes["narwhal.attempts"] == 2
    assert [e.name for e in request.events] == ["attempt_failed"]
    legs = [
        (s.name, s.attributes["narwhal.attempt"], s.attributes["narwhal.outcome"])
        for s in sorted(named["prefill"] + named["decode"], key=lambda s: s.start_time or 0)
        if s.attributes is not None
    ]
    assert legs == [
        ("prefill", 1, "ok"),
        ("decode", 1, "engine_5xx"),
        ("prefill", 2, "ok"),
        ("decode", 2, "ok"),
    ]
    assert len(received(consumer)) == 2  # each decode leg carried its own context


def test_a_failed_request_marks_its_failing_leg(
    servers: Servers, exporter: InMemorySpanExporter, pair: tuple[Emulator, Emulator]
) -> None:
    producer, consumer = pair
    producer.faults({"kind": "http_5xx", "count": 1})
    _, url = start_traced_router(servers, exporter, producer, consumer)
    assert completion(url).status_code == 502
    named = by_name(spans_once(exporter, 2))
    (request,), (prefill,) = named["POST /v1/completions"], named["prefill"]
    assert "decode" not in named
    assert request.attributes is not None and prefill.attributes is not None
    assert request.attributes["narwhal.outcome"] == "engine_5xx"
    assert request.attributes["http.response.status_code"] == 502
    assert prefill.attributes["narwhal.outcome"] == "engine_5xx"
    assert prefill.attributes["http.response.status_code"] == 500


def test_tracing_off_adds_no_span_and_no_header(
    servers: Servers, exporter: InMemorySpanExporter, pair: tuple[Emulator, Emulator]
) -> None:
    producer, consumer = pair
    router, url = start_traced_router(servers, exporter, producer, consumer, enabled=False)
    assert router.tracing is None
    assert completion(url).status_code == 200
    assert received(producer) == [] and received(consumer) == []
    assert exporter.get_finished_spans() == ()


def test_the_exporters_build_without_sending_anything() -> None:
    for exporter in ("console", "otlp"):
        settings = TracingSettings(enabled=True, exporter=exporter)
        tracing = RouterTracing(settings)
        assert isinstance(tracing.provider, TracerProvider)
        tracing.provider.shutdown()


def test_tracing_without_opentelemetry_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    with pytest.raises(TracingUnavailable, match=r"narwhal-router\[otel\]"):
        RouterTracing(TracingSettings(enabled=True))
