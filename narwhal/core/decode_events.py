"""A decode stream as an async iterator of classified events, for the callers off the hot path.

Rule kept here: the rules are :class:`~narwhal.core.legs.DecodeReader`'s; this only drives it
with ``await`` for probes, preflight and ``EngineClient`` (the lifecycle drives the reader in
its own loop). Its own module because mypyc, which compiles ``legs`` in the optional compiled
build (``setup.py``), cannot compile an async generator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from narwhal.core.legs import DecodeReader, LegFault
from narwhal.core.ports import Clock, Transport
from narwhal.core.sse import SseEvent


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
    """Yield ``(arrival time, event)`` for TOKEN, METADATA and the final DONE; raise LegFault
    otherwise. The async-iterator form of :class:`DecodeReader` for the callers off the hot
    path (probes, preflight, ``EngineClient``)."""
    reader = DecodeReader(
        consumer,
        first_token_at=first_token_at,
        first_token_timeout_s=first_token_timeout_s,
        decode_read_timeout_s=decode_read_timeout_s,
        request_deadline=request_deadline,
    )
    while True:
        result = await transport.next_chunk(handle, reader.deadline)
        for item in reader.read(result, clock.now()):
            yield item
        if reader.fault is not None:
            raise LegFault(reader.fault)
        if reader.done:
            return
