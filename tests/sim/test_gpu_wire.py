"""The simulated engine's bytes read back, through the router's own parsers, as what it says it
sends (the chunks of a stream, a producer's prefill reply), and its tokenizer counts one token
per character."""

from __future__ import annotations

import json

import pytest

from narwhal.core.descriptor import validate_descriptor
from narwhal.core.sse import EventKind, SseParser
from narwhal.sim.gpu import wire


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("n", [1, 16])
@pytest.mark.parametrize("final", [False, True])
def test_a_chunk_is_n_filler_tokens_of_its_request(chat: bool, n: int, final: bool) -> None:
    writer = wire.chunk_writer("req-7-d0", "llama3-8b", chat)
    [event] = SseParser().feed(wire.token_chunk(writer, n, final))
    assert event.kind is EventKind.TOKEN
    payload = event.payload
    assert isinstance(payload, dict)
    assert payload["id"] == ("chatcmpl-" if chat else "cmpl-") + "req-7-d0"
    assert payload["model"] == "llama3-8b" and payload["created"] == wire.CREATED
    choice = payload["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == "x" * n
    assert choice["finish_reason"] == ("length" if final else None)


@pytest.mark.parametrize("cached", [None, 32])
def test_the_prefill_reply_describes_the_blocks_to_pull(cached: int | None) -> None:
    blocks = [12, 11, 10, 0]
    body = wire.prefill_reply(
        "req-3-p0", "m", 61, blocks, "e-1", "cmpl-req-3-p0-0-0a0b0c0d", "10.0.0.2", 5600, cached
    )
    reply = json.loads(body)
    assert reply["id"] == "cmpl-req-3-p0" and reply["model"] == "m"
    assert reply["usage"]["prompt_tokens"] == 61 and reply["usage"]["completion_tokens"] == 1
    details = reply["usage"].get("prompt_tokens_details")
    assert details == (None if cached is None else {"cached_tokens": cached})
    params = reply["kv_transfer_params"]
    assert params["remote_block_ids"] == [blocks]
    assert params["remote_prefill_cached_tokens"] == (cached or 0)
    assert (params["remote_host"], params["remote_port"]) == ("10.0.0.2", 5600)
    validate_descriptor(params, "NixlConnector")


def test_the_tokenizer_counts_characters_ids_or_messages() -> None:
    assert wire.prompt_tokens({"prompt": "x" * 9}) == 10  # plus BOS
    assert wire.prompt_tokens({"prompt": [5, 6, 7]}) == 3
    assert wire.prompt_tokens({"messages": [{"role": "user", "content": "abc"}]}) == 3 + 4 + 2
    assert wire.prompt_tokens({"max_tokens": 3}) is None
