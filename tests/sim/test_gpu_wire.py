"""The simulated engine's templates write exactly core/wire.py's shapes (the chunks of a stream,
a producer's prefill reply), and its tokenizer counts one token per character."""

from __future__ import annotations

import pytest

from narwhal.core import wire as core
from narwhal.sim.gpu import wire


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("n", [1, 16])
@pytest.mark.parametrize("final", [False, True])
def test_stream_chunks_are_core_chunks(chat: bool, n: int, final: bool) -> None:
    chunks = core.ChunkWriter(
        core.completion_id("req-7-d0", chat), "llama3-8b", wire.CREATED, chat=chat
    )
    head = wire.chunk_head("req-7-d0", wire.json_text("llama3-8b"), chat)
    assert wire.token_chunk(head, n, final, chat) == chunks.token_chunk(
        "x" * n, "length" if final else None
    )
    if chat:
        assert wire.role_chunk(head) == chunks.role_chunk()


def test_the_prefill_reply_is_core_prefill_reply() -> None:
    blocks = [12, 11, 10, 0]
    ours = wire.prefill_reply(
        "req-3-p0",
        wire.json_text("m"),
        61,
        blocks,
        wire.block_id_texts(13),
        "e-1",
        "cmpl-req-3-p0-0-0a0b0c0d",
        "10.0.0.2",
        5600,
    )
    params = core.nixl_kv_params(
        block_ids=blocks,
        engine_id="e-1",
        request_id="cmpl-req-3-p0-0-0a0b0c0d",
        host="10.0.0.2",
        port=5600,
        num_tokens=61,
    )
    reply = core.prefill_reply(
        "cmpl-req-3-p0", "m", wire.CREATED, prompt_tokens=61, kv_transfer_params=params
    )
    assert ours == core.to_json(reply)


def test_the_tokenizer_counts_characters_ids_or_messages() -> None:
    assert wire.prompt_tokens({"prompt": "x" * 9}) == 10  # plus BOS
    assert wire.prompt_tokens({"prompt": [5, 6, 7]}) == 3
    assert wire.prompt_tokens({"messages": [{"role": "user", "content": "abc"}]}) == 3 + 4 + 2
    assert wire.prompt_tokens({"max_tokens": 3}) is None


def test_block_id_texts_cover_the_engines_blocks() -> None:
    small = wire.block_id_texts(13)
    assert small[:13] == [str(i) for i in range(13)]
    texts = wire.block_id_texts(70_001)  # grows past the ids it held
    assert len(texts) >= 70_001 and texts[12] == "12" and texts[70_000] == "70000"
