"""Optional OpenTelemetry tracing of the live router: one span per client request, one per
engine leg (prefill, decode), and W3C ``traceparent`` on every leg sent to an engine.

Rule kept here: tracing only observes. It changes no decision, no status and no byte sent to a
client; the one thing it adds to what engines receive is the ``traceparent`` header of each leg.
Off (``[tracing] enabled = false``, the default) it costs nothing: the router holds no
:class:`RouterTracing`, its transport is not wrapped and no header is added. OpenTelemetry is
imported only when tracing is switched on (the ``otel`` extra); the core never sees any of it.

Theory of operation: the hooks are the ones a driver already has, so the core stays as it is.
- A request span (``POST /v1/...``, kind SERVER) starts when the request reaches the router,
  continuing the client's ``traceparent`` when it sent one, and ends when the router reports
  the request's :class:`~narwhal.core.records.RequestRecord`, whose request id, outcome,
  status, attempts and committed flag become its attributes (the app adds endpoint and model).
- The legs are what the core asks the transport for, so :class:`TracedTransport` wraps the
  router's transport: inside a request, the POST ``call`` is the prefill leg and
  ``open_stream`` the decode leg. A leg span starts when the call starts (its ``traceparent``
  goes into that very request) and its end time is when the call returns, or for a 200 stream
  when the core closes it. Calls outside a request (probes, health checks, load scrapes) run in
  background tasks with no current request and pass through untouched.
- A leg's outcome is the core's judgment, not the transport's: each attempt ends either in the
  core's ``retry`` decision (its ``fault``) or in the request's record (its ``outcome``). That
  outcome belongs to the attempt's last leg (a decode leg starts only after a prefill that
  succeeded, and nothing follows a failed leg), except for the faults that arise between legs
  (``no_engine``, a stale ``handoff_too_old``) after a prefill that got its reply: then every
  leg of the attempt is ``ok``. A leg span is ended once both its end time and its outcome are
  known, with the end time the transport saw.
The request being served is found through a context variable set in the request's own task
(each HTTP request runs in a task of its own, so the variable never leaks between requests).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from narwhal import __version__
from narwhal.core.config import TracingSettings
from narwhal.core.ports import (
    CallResult,
    ChunkResult,
    OpenResult,
    Relay,
    Reply,
    StreamOpened,
    Transport,
)
from narwhal.core.records import Decision, RequestRecord

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import Span, TracerProvider

OTEL_EXTRA = "pip install 'narwhal-router[otel]'"
BETWEEN_LEGS = frozenset({"no_engine", "handoff_too_old"})  # faults no leg is the cause of

CURRENT: ContextVar[RequestTrace | None] = ContextVar("narwhal_request_trace", default=None)


class TracingUnavailable(RuntimeError):
    """``[tracing] enabled = true`` but OpenTelemetry (the ``otel`` extra) is not installed."""


class _Leg:
    """One engine leg's span, ended once its end time and its outcome are both known."""

    __slots__ = ("ended_ns", "otel", "outcome", "replied", "span")

    def __init__(self, span: Span, otel: Any) -> None:
        self.span = span
        self.otel = otel  # the opentelemetry.trace module
        self.ended_ns: int | None = None
        self.outcome: str | None = None
        self.replied = False  # the engine's answer (or its stream's headers) arrived

    def replied_with(self, status: int) -> None:
        self.replied = True
        self.span.set_attribute("http.response.status_code", status)

    def ended(self) -> None:
        """The transport is done with the leg (its call returned, its stream was closed)."""
        if self.ended_ns is None:
            self.ended_ns = time.time_ns()
            self._end_when_known()

    def judge(self, outcome: str) -> None:
        if self.outcome is not None:
            return
        self.outcome = outcome
        self.span.set_attribute("narwhal.outcome", outcome)
        if outcome != "ok":
            self.span.set_status(self.otel.Status(self.otel.StatusCode.ERROR, outcome))
        self._end_when_known()

    def _end_when_known(self) -> None:
        if self.ended_ns is not None and self.outcome is not None:
            self.span.end(end_time=self.ended_ns)


class RequestTrace:
    """The spans of one client request: its own and its legs'."""

    __slots__ = ("attempt", "legs", "request_id", "span", "tracing")

    def __init__(self, tracing: RouterTracing, span: Span, request_id: str) -> None:
        self.tracing = tracing
        self.span = span
        self.request_id = request_id
        self.attempt = 1
        self.legs: list[_Leg] = []  # the current attempt's legs, in the order they started

    def start_leg(
        self, phase: str, engine: str, headers: dict[str, str]
    ) -> tuple[_Leg, dict[str, str]]:
        """A leg span (child of the request span) and the headers to send it with."""
        tracing, otel = self.tracing, self.tracing.otel
        span = tracing.tracer.start_span(
            phase,
            context=otel.set_span_in_context(self.span),
            kind=otel.SpanKind.CLIENT,
            attributes={
                "narwhal.phase": phase,
                "narwhal.engine": engine,
                "narwhal.attempt": self.attempt,
                "narwhal.backend_request_id": headers.get("X-Request-Id", ""),
            },
        )
        leg = _Leg(span, otel)
        self.legs.append(leg)
        sent = dict(headers)
        tracing.propagator.inject(sent, context=otel.set_span_in_context(span))
        return leg, sent

    def attempt_ended(self, outcome: str, engine: str | None = None) -> None:
        """Judge the legs of the attempt that just ended in ``outcome``; the next one starts."""
        legs, self.legs = self.legs, []
        if outcome != "ok":
            attributes: dict[str, str | int] = {
                "narwhal.attempt": self.attempt,
                "narwhal.outcome": outcome,
            }
            if engine is not None:
                attributes["narwhal.engine"] = engine
            self.span.add_event("attempt_failed", attributes)
        self.attempt += 1
        if not legs:
            return
        *earlier, last = legs
        for leg in earlier:
            leg.judge("ok")
        between = outcome in BETWEEN_LEGS and last.replied
        last.judge("ok" if between else outcome)

    def finish(self, record: RequestRecord, attributes: Mapping[str, str]) -> None:
        """End the request span with what the record says (the last attempt ends with it)."""
        self.attempt_ended(record.outcome)
        span = self.span
        span.set_attributes(
            {
                "narwhal.request_id": record.request_id,
                "narwhal.outcome": record.outcome,
                "http.response.status_code": record.status,
                "narwhal.attempts": record.attempts,
                "narwhal.committed": record.committed,
                "narwhal.output_tokens": record.output_tokens,
                **attributes,
            }
        )
        if record.outcome != "ok":
            otel = self.tracing.otel
            span.set_status(otel.Status(otel.StatusCode.ERROR, record.error or record.outcome))
        span.end()

    def abandon(self, status: int | None) -> None:
        """End the span of a request answered before the core saw it (401, 400, 413)."""
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        self.span.set_attribute("narwhal.outcome", "rejected")
        self.span.end()


class RouterTracing:
    """The router's tracer, propagator and hooks; built only when tracing is on."""

    def __init__(self, settings: TracingSettings, provider: TracerProvider | None = None) -> None:
        try:
            from opentelemetry import trace as otel
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            raise TracingUnavailable(
                f"tracing.enabled = true needs OpenTelemetry: {OTEL_EXTRA}"
            ) from None
        self.otel: Any = otel
        self.provider = provider if provider is not None else _provider(settings)
        self.tracer = self.provider.get_tracer("narwhal", __version__)
        self.propagator = TraceContextTextMapPropagator()

    def begin_request(
        self, request_id: str, endpoint: str, headers: Mapping[str, str]
    ) -> RequestTrace:
        """Start the request span (continuing the client's ``traceparent``) and make it the
        current request's."""
        span = self.tracer.start_span(
            f"POST {endpoint}",
            context=self.propagator.extract(headers),
            kind=self.otel.SpanKind.SERVER,
            attributes={
                "narwhal.request_id": request_id,
                "http.request.method": "POST",
                "http.route": endpoint,
            },
        )
        trace = RequestTrace(self, span, request_id)
        CURRENT.set(trace)
        return trace

    def observing(self, on_decision: Callable[[Decision], None]) -> Callable[[Decision], None]:
        """``on_decision`` that also ends the current request's attempt on its ``retry``."""

        def observe(decision: Decision) -> None:
            on_decision(decision)
            if decision.kind != "retry":
                return
            trace = CURRENT.get()
            detail = dict(decision.detail)
            if trace is not None and detail.get("request") == trace.request_id:
                trace.attempt_ended(str(detail.get("fault", "")), decision.engine)

        return observe

    def wrap(self, transport: Transport) -> TracedTransport:
        return TracedTransport(transport)


def _provider(settings: TracingSettings) -> SdkTracerProvider:
    """An SDK provider exporting as ``settings`` say (batched; flushed at exit by the SDK)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise TracingUnavailable(f"tracing needs the OpenTelemetry SDK: {OTEL_EXTRA}") from None

    exporter: SpanExporter
    if settings.exporter == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout holds only JSON log lines
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingUnavailable(
                f"tracing.exporter = 'otlp' needs the OTLP exporter: {OTEL_EXTRA}"
            ) from None
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint or None)
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def start_tracing(
    settings: TracingSettings, provider: TracerProvider | None = None
) -> RouterTracing | None:
    """The router's tracing, or None when it is off."""
    return RouterTracing(settings, provider) if settings.enabled else None


class TracedTransport:
    """The router's transport with a leg span around each leg of the current request."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner
        self._streams: dict[Any, _Leg] = {}  # open 200 decode streams -> their leg

    async def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> CallResult:
        trace = CURRENT.get()
        if trace is None or method != "POST":
            return await self._inner.call(url, method, path, body, headers, deadline)
        leg, headers = trace.start_leg("prefill", url, headers)
        try:
            result = await self._inner.call(url, method, path, body, headers, deadline)
            if isinstance(result, Reply):
                leg.replied_with(result.status)
            return result
        finally:
            leg.ended()  # cancelled too: the record says why

    async def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> OpenResult:
        trace = CURRENT.get()
        if trace is None:
            return await self._inner.open_stream(url, path, body, headers, deadline)
        leg, headers = trace.start_leg("decode", url, headers)
        result: OpenResult | None = None
        try:
            result = await self._inner.open_stream(url, path, body, headers, deadline)
            return result
        finally:
            if isinstance(result, StreamOpened):
                leg.replied_with(result.status)
            if isinstance(result, StreamOpened) and result.status == 200:
                self._streams[result.handle] = leg  # the leg ends when the core closes it
            else:
                leg.ended()

    def next_chunk(self, handle: Any, deadline: float) -> Awaitable[ChunkResult]:
        return self._inner.next_chunk(handle, deadline)

    def relay_reads(self, handle: Any, relay: Relay) -> bool:
        return self._inner.relay_reads(handle, relay)

    def close_stream(self, handle: Any) -> None:
        leg = self._streams.pop(handle, None)
        if leg is not None:
            leg.ended()
        self._inner.close_stream(handle)

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        self._inner.release_handoff(producer_url, descriptor)
