"""The contract's Python API (``EngineClient.http``) over real HTTP against emulated engines."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from narwhal.core.sse import EventKind
from narwhal.emulator.text import completion_tokens, prompt_text
from narwhal.engines.client import EngineClient
from tests.live.conftest import Emulator


def test_prefill_result_passes_straight_to_decode(emulator: Callable[..., Emulator]) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    body = {"prompt": "Hello, narwhal", "max_tokens": 4}

    async def main() -> list[str]:
        async with (
            EngineClient.http(producer.url, kv_endpoint=producer.side_channel) as prefill,
            EngineClient.http(consumer.url) as decode,
        ):
            result = await prefill.prefill(body)
            assert result.parameters()["remote_engine_id"] == producer.app.engine_id
            return [
                e.payload["choices"][0]["text"]
                async for e in decode.decode(result, body)
                if e.kind is EventKind.TOKEN and e.payload is not None
            ]

    assert anyio.run(main) == completion_tokens(prompt_text(body, chat=False), 4)
    assert consumer.state()["pulls_ok"] == 1


def connections(engine: Emulator) -> int:
    """Client connections open now on the engine's HTTP port (not its KV side channel, which
    the consumer engine's own pool keeps alive)."""
    port = int(engine.url.rsplit(":", 1)[1])
    held = list(engine.server.server.server_state.connections)
    return sum(1 for c in held if c.transport.get_extra_info("sockname")[1] == port)


def test_leaving_the_client_closes_its_pool(emulator: Callable[..., Emulator]) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    body = {"prompt": "Hello, narwhal", "max_tokens": 4}

    async def main() -> tuple[list[int], list[int]]:
        async with (
            EngineClient.http(producer.url) as prefill,
            EngineClient.http(consumer.url) as decode,
        ):
            result = await prefill.prefill(body)
            async for _ in decode.decode(result, body):
                pass
            # The stream's close hands the connection back to the decode client's pool once
            # the body has ended: wait for that, bounded.
            pool = decode._transport.pool
            returned = time.monotonic() + 5.0
            while time.monotonic() < returned and not (
                pool.idle() and pool.open == len(pool.idle())
            ):
                await anyio.sleep(0.01)
            held = [connections(producer), connections(consumer)]
        # The clients still exist, so only closing them can drop the connections before the
        # engines' own keep-alive timeout (5 s) would.
        deadline = time.monotonic() + 2.0
        while connections(producer) + connections(consumer) and time.monotonic() < deadline:
            await anyio.sleep(0.01)
        return held, [connections(producer), connections(consumer)]

    held, left = anyio.run(main)
    assert held == [1, 1]  # kept alive while the clients were open
    assert left == [0, 0]
