"""The two engine legs, read the one way every caller shares (lifecycle, probes, EngineClient).

Rule kept here: how a prefill reply becomes a validated descriptor, and how a decode stream
becomes a sequence of classified events under the first-token and silence timeouts, is written
once. Faults come out as :class:`~narwhal.core.errors.Fault` values (``LegFault`` carries one
out of the event iterator).

Theory of operation: :func:`read_prefill` maps an HTTP reply to a descriptor or a fault.
:class:`DecodeReader` holds a decode stream's rules without doing I/O: the deadline for each read
— ``first_token_at`` until the first generated token, then ``arrival + decode_read_timeout_s``
(or the request deadline when that is 0) after every chunk — and what a read means: it feeds
the SSE parser and returns ``(arrival time, event)`` for tokens, metadata and the final
``[DONE]``, or records the fault (timeouts, early closes, in-band errors, malformed data,
``[DONE]`` before any token). The lifecycle drives it directly (one plain loop per stream);
:func:`~narwhal.core.decode_events.stream_events` wraps it as an async iterator for probes,
preflight and ``EngineClient``.

What an engine sends is bounded, so a broken engine cannot exhaust the router's memory: a
prefill reply over :data:`MAX_REPLY_BYTES` (the transport stops reading one byte past it) and an
SSE event still unfinished past :data:`MAX_EVENT_BYTES` are malformed responses (502).
"""

from __future__ import annotations

from typing import Any

from narwhal.core.descriptor import DescriptorError, validate_descriptor
from narwhal.core.errors import DONE_BEFORE_TOKEN_TEXT, SILENCE_TEXT, Fault, FaultKind, fault
from narwhal.core.jsonparse import parse_json
from narwhal.core.ports import (
    Burst,
    Chunk,
    ChunkResult,
    ConnectFailed,
    Reply,
    TimedOut,
)
from narwhal.core.sse import EventKind, SseEvent, SseParser, SseTooLarge

# Generous: a vLLM reply or event carrying prompt logprobs of a long prompt runs to megabytes.
MAX_REPLY_BYTES = 16 * 1024 * 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024


class LegFault(Exception):
    """A fault ended a leg; ``fault`` says which, with its status and the engine charged."""

    def __init__(self, failure: Fault) -> None:
        super().__init__(failure.message)
        self.fault = failure


def connect_fault(result: ConnectFailed, engine: str, phase: str) -> Fault:
    kind = FaultKind.REFUSED if result.reason == "refused" else FaultKind.RESET
    return fault(kind, f"{phase} engine {result.reason}", engine=engine, phase=phase)


def http_fault(status: int, raw: bytes, engine: str, phase: str) -> Fault:
    """A non-200 answer: 4xx passed through as is (body kept), anything else a 502."""
    if 400 <= status < 500:
        try:
            parsed = parse_json(raw)
        except ValueError:
            parsed = None
        return fault(
            FaultKind.ENGINE_4XX,
            f"{phase} engine rejected the request ({status})",
            engine=engine,
            phase=phase,
            status=status,
            upstream_body=parsed if isinstance(parsed, dict) else None,
        )
    return fault(
        FaultKind.ENGINE_5XX, f"{phase} engine answered HTTP {status}", engine=engine, phase=phase
    )


def read_prefill(
    reply: Reply, producer: str, connector: str, pinned_side_channel: str | None
) -> dict[str, Any] | Fault:
    """The validated descriptor of a prefill reply, or the fault it shows."""
    if reply.status != 200:
        return http_fault(reply.status, reply.body, producer, "prefill")
    if len(reply.body) > MAX_REPLY_BYTES:
        return fault(
            FaultKind.MALFORMED_RESPONSE,
            f"prefill response over {MAX_REPLY_BYTES} bytes",
            engine=producer,
            phase="prefill",
        )
    try:
        payload = parse_json(reply.body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return fault(
            FaultKind.MALFORMED_RESPONSE,
            "prefill response is not a JSON object",
            engine=producer,
            phase="prefill",
        )
    try:
        return validate_descriptor(
            payload.get("kv_transfer_params"), connector, pinned_side_channel
        )
    except DescriptorError as error:
        return fault(
            FaultKind.BAD_DESCRIPTOR,
            f"invalid KV descriptor from producer ({error.reason.value}): {error.detail}",
            engine=producer,
            phase="prefill",
        )


def timeout_fault(
    consumer: str,
    bound: float,
    request_deadline: float,
    got_token: bool,
    first_token_timeout_s: float,
    decode_read_timeout_s: float,
) -> Fault:
    """Which timeout a decode read hit: the request deadline, first token, or silence."""
    if bound >= request_deadline:
        return fault(
            FaultKind.DEADLINE,
            "request deadline passed while decoding",
            engine=None,
            phase="decode",
        )
    if not got_token:
        return fault(
            FaultKind.FIRST_TOKEN_TIMEOUT,
            f"engine produced no token within first_token_timeout_s ({first_token_timeout_s:g} s)",
            engine=consumer,
            phase="decode",
        )
    return fault(
        FaultKind.SILENCE,
        f"{SILENCE_TEXT} (no chunk for decode_read_timeout_s = {decode_read_timeout_s:g} s)",
        engine=consumer,
        phase="decode",
    )


class DecodeReader:
    """The rules of one decode stream as a sans-IO object: the deadline for the next read, and
    what each read means.

    ``read(result, now)`` turns one transport result into the ``(arrival time, event)`` pairs
    it carries (tokens, metadata, and a final ``[DONE]`` after at least one token), in order.
    When the read shows a fault (a timeout, an early close, an in-band error, malformed data,
    ``[DONE]`` before any token) the events before it are still returned and :attr:`fault` is
    set; nothing is read after a fault or after ``[DONE]``. A :class:`Burst` is taken read by
    read, each at its own arrival time, exactly as if the reads had come one at a time.
    """

    __slots__ = (
        "consumer",
        "deadline",
        "decode_read_timeout_s",
        "done",
        "fault",
        "first_token_timeout_s",
        "got_token",
        "parser",
        "request_deadline",
    )

    def __init__(
        self,
        consumer: str,
        *,
        first_token_at: float,
        first_token_timeout_s: float,
        decode_read_timeout_s: float,
        request_deadline: float,
    ) -> None:
        self.consumer = consumer
        self.deadline = first_token_at  # until the first token; then silence or the request's
        self.first_token_timeout_s = first_token_timeout_s
        self.decode_read_timeout_s = decode_read_timeout_s
        self.request_deadline = request_deadline
        self.got_token = False
        self.done = False
        self.fault: Fault | None = None
        self.parser = SseParser(max_event_bytes=MAX_EVENT_BYTES)

    def read(self, result: ChunkResult, now: float) -> list[tuple[float, SseEvent]]:
        """The events of one read result, each with its arrival time (see the class)."""
        out: list[tuple[float, SseEvent]] = []
        if type(result) is Chunk:  # checked first: nearly every live read is a chunk
            self._take(now, result.data, out)
        elif type(result) is Burst:
            for at, data in result.reads:
                if at >= self.deadline:
                    self.fault = self._timeout()
                    break
                self._take(at, data, out)
                if self.done or self.fault is not None:
                    break
        elif isinstance(result, TimedOut):
            self.fault = self._timeout()
        else:  # StreamEnd | ConnectFailed
            self.fault = fault(
                FaultKind.CLOSED_BEFORE_DONE,
                "engine closed the stream before [DONE]",
                engine=self.consumer,
                phase="decode",
            )
        return out

    def _timeout(self) -> Fault:
        return timeout_fault(
            self.consumer,
            self.deadline,
            self.request_deadline,
            self.got_token,
            self.first_token_timeout_s,
            self.decode_read_timeout_s,
        )

    def _take(self, at: float, data: bytes, out: list[tuple[float, SseEvent]]) -> None:
        """One transport read that arrived at ``at``."""
        try:
            events = self.parser.feed(data)  # a direct call when compiled (a bound method is not)
        except SseTooLarge:
            self.fault = fault(
                FaultKind.MALFORMED_RESPONSE,
                f"engine sent a server-sent event over {MAX_EVENT_BYTES} bytes",
                engine=self.consumer,
                phase="decode",
            )
            return
        for event in events:
            kind = event.kind
            if kind is EventKind.TOKEN:
                self.got_token = True
            elif kind is EventKind.ERROR:
                self.fault = fault(
                    FaultKind.INBAND_ERROR,
                    f"engine error in stream: {event.error_message or 'unknown error'}",
                    engine=self.consumer,
                    phase="decode",
                    status=event.error_status or 502,
                )
                return
            elif kind is EventKind.MALFORMED:
                self.fault = fault(
                    FaultKind.MALFORMED_RESPONSE,
                    "engine sent malformed SSE data",
                    engine=self.consumer,
                    phase="decode",
                )
                return
            elif kind is EventKind.DONE:
                if not self.got_token:
                    self.fault = fault(
                        FaultKind.DONE_BEFORE_TOKEN,
                        DONE_BEFORE_TOKEN_TEXT,
                        engine=self.consumer,
                        phase="decode",
                    )
                    return
                out.append((at, event))
                self.done = True
                return
            out.append((at, event))
        if self.got_token:  # any chunk, metadata too, resets the silence timer
            timeout = self.decode_read_timeout_s
            bound = at + timeout if timeout > 0 else self.request_deadline
            self.deadline = bound if bound < self.request_deadline else self.request_deadline
