"""The contract's Python API (``EngineClient.http``) over real HTTP against emulated engines."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from narwhal.core.sse import EventKind
from narwhal.engines.client import EngineClient
from narwhal.live.emulator.text import completion_tokens, prompt_text
from tests.live.conftest import Emulator


def test_prefill_result_passes_straight_to_decode(emulator: Callable[..., Emulator]) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    body = {"prompt": "Hello, narwhal", "max_tokens": 4}

    async def main() -> list[str]:
        prefill = EngineClient.http(producer.url, kv_endpoint=producer.side_channel)
        decode = EngineClient.http(consumer.url)
        result = await prefill.prefill(body)
        assert result.parameters()["remote_engine_id"] == producer.app.engine_id
        texts = [
            e.payload["choices"][0]["text"]
            async for e in decode.decode(result, body)
            if e.kind is EventKind.TOKEN and e.payload is not None
        ]
        await anyio.sleep(0.05)  # let the scheduled stream close run
        return texts

    assert anyio.run(main) == completion_tokens(prompt_text(body, chat=False), 4)
    assert consumer.state()["pulls_ok"] == 1
