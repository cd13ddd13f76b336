"""core/wire's JSON writers are byte for byte the encoder's output, fast path or not."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from narwhal.core.wire import (
    ChunkWriter,
    completion_reply,
    int_items,
    json_string,
    nixl_kv_params,
    prefill_reply,
    to_json,
)


@given(st.text())
def test_json_string_is_the_encoders_output(text: str) -> None:
    assert json_string(text) == to_json(text)


@given(st.text(), st.text(), st.integers(min_value=0, max_value=2**40), st.booleans())
def test_a_chunk_is_the_json_vllm_writes(rid: str, model: str, created: int, chat: bool) -> None:
    writer = ChunkWriter(rid, model, created, chat=chat)
    chunk = writer.token_chunk('tok"en\\', "length")
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    event = json.loads(chunk[len(b"data: ") :])
    head = {"id": rid, "object": event["object"], "created": created, "model": model}
    assert to_json(event)[: len(to_json(head)) - 1] == to_json(head)[:-1]
    choice = event["choices"][0]
    assert (choice["delta"]["content"] if chat else choice["text"]) == 'tok"en\\'


@given(st.lists(st.integers()))
def test_int_items_are_the_encoders_list_items(values: list[int]) -> None:
    assert b"[" + int_items(values) + b"]" == to_json(values)


@given(
    texts=st.lists(st.text(), min_size=6, max_size=6),
    numbers=st.lists(st.integers(min_value=0, max_value=2**40), min_size=3, max_size=3),
    block_ids=st.lists(st.integers(min_value=0, max_value=2**20)),
    cached=st.none() | st.integers(min_value=0, max_value=2**20),
)
def test_a_prefill_reply_is_the_completion_the_encoder_writes(
    texts: list[str], numbers: list[int], block_ids: list[int], cached: int | None
) -> None:
    response_id, model, engine_id, request_id, host, text = texts
    created, prompt, port = numbers
    params = nixl_kv_params(
        block_ids=block_ids,
        engine_id=engine_id,
        request_id=request_id,
        host=host,
        port=port,
        num_tokens=prompt,
        cached_tokens=cached or 0,
    )
    expected = completion_reply(
        response_id,
        model,
        created,
        text,
        prompt_tokens=prompt,
        completion_tokens=1,
        kv_transfer_params=params,
        cached_tokens=cached,
    )
    written = prefill_reply(
        response_id,
        model,
        created,
        prompt_tokens=prompt,
        block_ids=block_ids,
        engine_id=engine_id,
        request_id=request_id,
        host=host,
        port=port,
        cached_tokens=cached,
        text=text,
    )
    assert written == to_json(expected)
