"""core/wire's JSON writers are byte for byte the encoder's output, fast path or not."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from narwhal.core.wire import ChunkWriter, json_string, to_json


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
