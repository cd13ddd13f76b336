"""The httpx transport over loopback: finished streams keep their connection, abandoned ones
do not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from narwhal.core.ports import Chunk, StreamOpened
from narwhal.live.clock import AnyioClock
from narwhal.live.transport import HttpxTransport
from tests.live.conftest import Emulator

BODY = {"prompt": "hello", "max_tokens": 3, "stream": True}


def pooled_connections(transport: HttpxTransport) -> int:
    pool: Any = transport.client._transport._pool  # httpx internals, read-only, for this test
    return len(pool.connections)


async def read_to_done(transport: HttpxTransport, clock: AnyioClock, url: str) -> None:
    opened = await transport.open_stream(url, "/v1/completions", BODY, {}, clock.now() + 5)
    assert isinstance(opened, StreamOpened) and opened.status == 200
    seen = b""
    while b"[DONE]" not in seen:
        chunk = await transport.next_chunk(opened.handle, clock.now() + 5)
        assert isinstance(chunk, Chunk)
        seen += chunk.data
    transport.close_stream(opened.handle)


def test_finished_streams_reuse_one_connection(emulator: Callable[..., Emulator]) -> None:
    engine = emulator(role="both")

    async def main() -> int:
        clock = AnyioClock()
        async with HttpxTransport(clock) as transport:
            for _ in range(4):
                await read_to_done(transport, clock, engine.url)
                await anyio.sleep(0.05)  # the scheduled close runs in the background
            return pooled_connections(transport)

    assert anyio.run(main) == 1


def test_abandoned_stream_drops_its_connection(emulator: Callable[..., Emulator]) -> None:
    engine = emulator(role="both")
    engine.faults({"kind": "hang_first_token"})

    async def main() -> int:
        clock = AnyioClock()
        async with HttpxTransport(clock) as transport:
            opened = await transport.open_stream(
                engine.url, "/v1/completions", BODY, {}, clock.now() + 5
            )
            assert isinstance(opened, StreamOpened)
            transport.close_stream(opened.handle)
            await anyio.sleep(0.3)  # past the bounded drain
            return pooled_connections(transport)

    assert anyio.run(main) == 0
