"""core/wire.py: every shape it writes reads back, through the router's own parsers, as what
it says it is — the bytes the simulated engine and the emulator send are the bytes the router
classifies."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from narwhal.core import wire
from narwhal.core.descriptor import validate_descriptor
from narwhal.core.sse import EventKind, SseParser


def events(data: bytes) -> list[tuple[EventKind, object]]:
    parser = SseParser()
    return [(event.kind, event.payload) for event in parser.feed(data)]


def only_event(data: bytes) -> tuple[EventKind, object]:
    found = events(data)
    assert len(found) == 1, found
    return found[0]


def test_done_is_the_done_event() -> None:
    assert only_event(wire.DONE)[0] is EventKind.DONE


@given(text=st.text(min_size=1), finish=st.sampled_from([None, "length", "stop"]))
def test_a_completions_token_chunk_is_a_token_with_that_text(text: str, finish: str | None) -> None:
    writer = wire.ChunkWriter("cmpl-r1", "tiny-llama", 1_700_000_000, chat=False)
    kind, payload = only_event(writer.token_chunk(text, finish))
    assert kind is EventKind.TOKEN
    assert payload == {
        "id": "cmpl-r1",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "tiny-llama",
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        ],
    }


@given(text=st.text(min_size=1), model=st.text(min_size=1))
def test_a_chat_token_chunk_is_a_token_with_that_content(text: str, model: str) -> None:
    writer = wire.ChunkWriter("chatcmpl-r1", model, 7, chat=True)
    kind, payload = only_event(writer.token_chunk(text))
    assert kind is EventKind.TOKEN
    assert payload == {
        "id": "chatcmpl-r1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": model,
        "choices": [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        ],
    }


def test_role_and_usage_chunks_are_metadata_not_tokens() -> None:
    writer = wire.ChunkWriter("chatcmpl-r1", "m", 7, chat=True)
    kind, payload = only_event(writer.role_chunk())
    assert kind is EventKind.METADATA
    assert isinstance(payload, dict)
    assert payload["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    kind, payload = only_event(writer.usage_chunk(12, 3))
    assert kind is EventKind.METADATA
    assert isinstance(payload, dict)
    assert payload["choices"] == []
    assert payload["usage"] == {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3}


def test_an_empty_text_chunk_is_not_a_token() -> None:
    writer = wire.ChunkWriter("cmpl-r1", "m", 7, chat=False)
    assert only_event(writer.token_chunk("", "length"))[0] is EventKind.METADATA


def test_an_error_event_is_read_with_its_own_status_and_message() -> None:
    parser = SseParser()
    (event,) = parser.feed(wire.error_event(503, "engine overloaded"))
    assert event.kind is EventKind.ERROR
    assert event.error_status == 503
    assert event.error_message == "engine overloaded"


def test_error_object_defaults_to_vllms_type_for_the_status() -> None:
    assert wire.error_object(404, "Not Found") == {
        "error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}
    }
    assert wire.error_type(599) == "InternalServerError"
    assert wire.error_type(418) == "BadRequestError"
    assert wire.error_object(503, "x", "service_unavailable", code="overloaded")["error"] == {
        "message": "x",
        "type": "service_unavailable",
        "param": None,
        "code": "overloaded",
    }
    assert json.loads(wire.error_body(400, "bad")) == wire.error_object(400, "bad")


def test_a_prefill_reply_carries_a_descriptor_the_router_accepts() -> None:
    reply = wire.prefill_reply(
        "cmpl-r1",
        "m",
        7,
        prompt_tokens=40,
        block_ids=[3, 1, 2],
        engine_id="engine-a",
        request_id="cmpl-r1-0-0000002a",
        host="10.0.0.1",
        port=5600,
    )
    decoded = json.loads(reply)
    assert decoded["usage"] == {"prompt_tokens": 40, "total_tokens": 41, "completion_tokens": 1}
    assert decoded["choices"][0]["text"] == "x"
    checked = validate_descriptor(decoded["kv_transfer_params"], "NixlConnector", "10.0.0.1:5600")
    assert checked["remote_block_ids"] == [[3, 1, 2]]
    assert checked["remote_engine_id"] == "engine-a"


def test_a_chat_reply_has_a_message() -> None:
    reply = wire.completion_reply(
        "chatcmpl-r1", "m", 7, "hi", prompt_tokens=2, completion_tokens=1, chat=True
    )
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert reply["kv_transfer_params"] is None


def test_completion_ids_follow_vllm() -> None:
    assert wire.completion_id("r1", chat=False) == "cmpl-r1"
    assert wire.completion_id("r1", chat=True) == "chatcmpl-r1"
