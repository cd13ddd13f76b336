"""What the live router reports about each client request: its metrics, its one JSON log line
and (tracing on) its span, all from the core's :class:`~narwhal.core.records.RequestRecord`.

Rule kept here: a request is reported once, as what its client got. The core's record says so
for every ending the core sees; the one it cannot see is the server's own shutdown: when the
grace period ends, the server cancels the request and the core's ``finally`` records a
cancelled request (``client_gone``) although the client is still there and is then answered by
the app (503, or a terminal event after the commit). Such a record is held until the app says
how it ended it (:meth:`RequestReporter.shut_down`), and is reported then as the core says
such a request is recorded (:func:`narwhal.core.shutdown.shutdown_record`).

Theory of operation: the app calls :meth:`RequestReporter.begin` for each admitted inference
request and :meth:`RequestReporter.end` when done with it. ``begin`` makes a
:class:`ServedRequest` (the request's id, sink, model label and trace) the current one of the
request's task (a context variable: each HTTP request runs in its own task), so the core's
``on_record`` callback, called synchronously in that task, finds it. The ``model`` label is
bounded (:class:`ModelLabels`): a client chooses the model string, and a label value per string
would let clients grow the metrics without limit.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar, Token
from typing import Any, BinaryIO

from narwhal.core.records import RequestRecord
from narwhal.core.shutdown import CANCELLED, shutdown_record
from narwhal.live.clock import AnyioClock, to_wall
from narwhal.live.jsonwrite import json_line
from narwhal.live.metrics import RouterMetrics
from narwhal.live.sink import ResponseSink
from narwhal.live.tracing import RequestTrace, RouterTracing

UNKNOWN_MODEL = "unknown"  # the body was never read (refused at admission)
OTHER_MODEL = "other"  # a model string outside the known set
MAX_MODEL_LABELS = 32

log = logging.getLogger("narwhal.live")

RequestLog = Callable[[bytes], None]
"""Where the request log's lines go: called with each line (a JSON object and ``\\n``)."""


class StdoutRequestLog:
    """The JSON request log on stdout (``narwhal serve``, each of its workers alike).

    Each line is one write, so lines of several processes never interleave within a line;
    people read stderr. The lines are a data stream, not diagnostics: they bypass ``logging``,
    whose records, levels and handlers cost several times the line itself. A write that fails
    (stdout closed, a reader gone) is reported once on stderr and ends the log; serving goes
    on.
    """

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = sys.stdout.buffer if stream is None else stream
        self.failed = False

    def __call__(self, line: bytes) -> None:
        if self.failed:
            return
        try:
            self.stream.write(line)
            self.stream.flush()
        except (OSError, ValueError) as error:  # ValueError: the stream was closed
            self.failed = True
            log.error("the request log's stdout failed (%s): no more request lines", error)


class ModelLabels:
    """The ``model`` label's values: the model a request asked for, from a bounded set.

    The set is the configured ``engine_contract.model`` when one is pinned (every engine serves
    it, and a request without ``model`` is served by it); otherwise the model names the engines
    list in ``/v1/models`` (learned whenever the router asks them: ``narwhal serve`` at start
    and every ``GET /v1/models``), at most :data:`MAX_MODEL_LABELS`. Anything else is
    ``other``.
    """

    def __init__(self, pinned: str | None) -> None:
        self.pinned = pinned
        self.known: set[str] = {pinned} if pinned is not None else set()

    def learn(self, names: Iterable[Any]) -> None:
        if self.pinned is not None:
            return
        for name in names:
            if isinstance(name, str) and len(self.known) < MAX_MODEL_LABELS:
                self.known.add(name)

    def label(self, requested: Any) -> str:
        if requested is None and self.pinned is not None:
            return self.pinned
        return requested if isinstance(requested, str) and requested in self.known else OTHER_MODEL


class ServedRequest:
    """One inference request while the app serves it."""

    __slots__ = (
        "endpoint",
        "held",
        "model",
        "prompt",
        "request_id",
        "requested_model",
        "sink",
        "token",
        "trace",
    )

    def __init__(
        self, request_id: str, endpoint: str, sink: ResponseSink, trace: RequestTrace | None
    ) -> None:
        self.request_id = request_id
        self.endpoint = endpoint
        self.sink = sink
        self.trace = trace
        self.model = UNKNOWN_MODEL
        self.requested_model: str | None = None  # the client's own string (the span's), bounded
        self.held: RequestRecord | None = None  # a cancelled request's record, awaiting why
        # what the log says of the prompt (narwhal.core.prompt_identity; None: never parsed)
        self.prompt: dict[str, Any] | None = None
        self.token: Token[ServedRequest | None] | None = None  # CURRENT's, to reset it

    def set_model(self, labels: ModelLabels, requested: Any) -> None:
        self.model = labels.label(requested)
        if isinstance(requested, str):
            self.requested_model = requested[:256]


CURRENT: ContextVar[ServedRequest | None] = ContextVar("narwhal_served_request", default=None)


class RequestReporter:
    """Turns each request's record into its metrics, log line and span."""

    def __init__(
        self,
        metrics: RouterMetrics,
        clock: AnyioClock,
        models: ModelLabels,
        tracing: RouterTracing | None,
        request_log: RequestLog | None = None,
    ) -> None:
        self.metrics = metrics
        self.request_log = request_log
        self.clock = clock
        self.models = models
        self.tracing = tracing

    def begin(
        self, request_id: str, endpoint: str, headers: Mapping[str, str], sink: ResponseSink
    ) -> ServedRequest:
        """Make the request the current one of its task (its span starts: tracing on)."""
        tracing = self.tracing
        trace = None if tracing is None else tracing.begin_request(request_id, endpoint, headers)
        served = ServedRequest(request_id, endpoint, sink, trace)
        served.token = CURRENT.set(served)
        return served

    def end(self, served: ServedRequest) -> None:
        """The app is done with the request: report what it left unreported (a held record,
        a span of a request answered before the core saw it, 400 or 413)."""
        if served.token is not None:
            CURRENT.reset(served.token)
            served.token = None
        if served.held is not None:
            held, served.held = served.held, None
            self.report(held, served)
        elif served.trace is not None:
            served.trace.abandon(served.sink.status)
            served.trace = None

    def on_record(self, record: RequestRecord) -> None:
        """``Policies(on_record=...)``: report ``record``, or hold a cancelled one whose client
        is still there (the app's shutdown answer says how it ended)."""
        served = CURRENT.get()
        if served is not None and served.request_id != record.request_id:
            served = None
        if (
            served is not None
            and record.outcome == CANCELLED
            and not served.sink.gone
            and not served.sink.cut
        ):
            served.held = record
            return
        self.report(record, served)

    def shut_down(self, served: ServedRequest, committed: bool) -> None:
        """The app answered ``served`` for the shutdown (``committed``: after the 200)."""
        held, served.held = served.held, None
        if held is not None:
            self.report(shutdown_record(held, committed), served)

    def report(self, record: RequestRecord, served: ServedRequest | None) -> None:
        model = served.model if served is not None else UNKNOWN_MODEL
        self.metrics.on_record(record, model)
        if self.request_log is not None:
            prompt = served.prompt if served is not None else None
            self.request_log(self._log_line(record, model, prompt))
        if served is not None and served.trace is not None:
            trace, served.trace = served.trace, None
            attributes = {"http.route": served.endpoint, "narwhal.model": model}
            if served.requested_model is not None:
                attributes["gen_ai.request.model"] = served.requested_model
            trace.finish(record, attributes)

    def _log_line(self, record: RequestRecord, model: str, prompt: dict[str, Any] | None) -> bytes:
        """The request's one JSON log line (with what a replay needs of its prompt, when the
        body was parsed: ``narwhal.core.prompt_identity``)."""
        line = {
            "event": "request",
            "request_id": record.request_id,
            "arrival": to_wall(self.clock, record.arrival),
            "model": model,
            "ttft_s": record.ttft_s,
            "first_byte_s": record.first_byte_s,
            "finished_s": record.finished_s,
            "attempts": record.attempts,
            "engines": list(record.engines),
            "outcome": record.outcome,
            "status": record.status,
            "committed": record.committed,
            "output_tokens": record.output_tokens,
            "prompt_tokens": record.prompt_tokens,
            "prefill_fallback": record.prefill_fallback,
            "error": record.error,
        }
        if record.resumes:  # only with [recovery] resume_streams: a stream resumed elsewhere
            line["resumes"] = record.resumes
        if record.resume_refused is not None:  # ... or why it could not be
            line["resume_refused"] = record.resume_refused
        if prompt is not None:
            line.update(prompt)
        return json_line(line)
