"""The two engine legs, read the one way every caller shares (lifecycle, probes, EngineClient).

Rule kept here: how a prefill reply becomes a validated descriptor, and how a decode stream
becomes a sequence of classified events under the first-token and silence timeouts, is written
once. Faults come out as :class:`~narwhal.core.errors.Fault` values (``LegFault`` carries one
out of the event iterator).

Theory of operation: :func:`read_prefill` maps an HTTP reply to a descriptor or a fault.
:func:`stream_events` pulls chunks from an open stream with the right deadline for each read —
``first_token_at`` until the first generated token, then ``now + decode_read_timeout_s`` (or the
request deadline when that is 0) after every chunk — feeds the SSE parser and yields
``(now, event)`` for tokens, metadata and the final ``[DONE]``. It raises :class:`LegFault`
for timeouts, early closes, in-band errors, malformed data and ``[DONE]`` before any token.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from narwhal.core.descriptor import DescriptorError, validate_descriptor
from narwhal.core.errors import DONE_BEFORE_TOKEN_TEXT, SILENCE_TEXT, Fault, FaultKind, fault
from narwhal.core.ports import Chunk, Clock, ConnectFailed, Reply, StreamEnd, TimedOut, Transport
from narwhal.core.sse import EventKind, SseEvent, SseParser


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
            parsed = json.loads(raw)
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
    try:
        payload = json.loads(reply.body)
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


async def stream_events(
    transport: Transport,
    clock: Clock,
    handle: Any,
    consumer: str,
    *,
    first_token_at: float,
    first_token_timeout_s: float,
    decode_read_timeout_s: float,
    request_deadline: float,
) -> AsyncIterator[tuple[float, SseEvent]]:
    """Yield ``(now, event)`` for TOKEN, METADATA and the final DONE; raise LegFault otherwise."""
    feed = SseParser().feed
    got_token = False
    deadline = first_token_at
    while True:
        result = await transport.next_chunk(handle, deadline)
        now = clock.now()
        if not isinstance(result, Chunk):  # checked first: nearly every read is a chunk
            if isinstance(result, TimedOut):
                raise LegFault(
                    timeout_fault(
                        consumer,
                        deadline,
                        request_deadline,
                        got_token,
                        first_token_timeout_s,
                        decode_read_timeout_s,
                    )
                )
            if isinstance(result, StreamEnd | ConnectFailed):
                raise LegFault(
                    fault(
                        FaultKind.CLOSED_BEFORE_DONE,
                        "engine closed the stream before [DONE]",
                        engine=consumer,
                        phase="decode",
                    )
                )
            assert isinstance(result, Chunk)
        for event in feed(result.data):
            kind = event.kind
            if kind is EventKind.TOKEN:
                got_token = True
            elif kind is EventKind.ERROR:
                raise LegFault(
                    fault(
                        FaultKind.INBAND_ERROR,
                        f"engine error in stream: {event.error_message or 'unknown error'}",
                        engine=consumer,
                        phase="decode",
                        status=event.error_status or 502,
                    )
                )
            elif kind is EventKind.MALFORMED:
                raise LegFault(
                    fault(
                        FaultKind.MALFORMED_RESPONSE,
                        "engine sent malformed SSE data",
                        engine=consumer,
                        phase="decode",
                    )
                )
            elif kind is EventKind.DONE and not got_token:
                raise LegFault(
                    fault(
                        FaultKind.DONE_BEFORE_TOKEN,
                        DONE_BEFORE_TOKEN_TEXT,
                        engine=consumer,
                        phase="decode",
                    )
                )
            yield now, event
            if kind is EventKind.DONE:
                return
        if got_token:  # any chunk, metadata too, resets the silence timer
            bound = now + decode_read_timeout_s if decode_read_timeout_s > 0 else request_deadline
            deadline = min(bound, request_deadline)
