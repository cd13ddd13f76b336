"""Tests for narwhal.core.sse's classification: what each vLLM chunk is (token, metadata,
error, done) and what an in-band error says."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.core.sse import (
    DEFAULT_ERROR_STATUS,
    EventKind,
    SseEvent,
    classify,
)
from tests.core.sse_samples import (
    CHAT_CONTENT,
    CHAT_FINISH,
    CHAT_REASONING,
    CHAT_ROLE,
    CHAT_TOOL_CALL,
    COMPLETION_FINISH,
    COMPLETION_TOKEN,
    ERROR_400,
    ERROR_500,
    USAGE,
    error_event,
)

# ---------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (COMPLETION_TOKEN, EventKind.TOKEN),
        (COMPLETION_FINISH, EventKind.METADATA),
        (CHAT_ROLE, EventKind.METADATA),
        (CHAT_CONTENT, EventKind.TOKEN),
        (CHAT_FINISH, EventKind.METADATA),
        (CHAT_REASONING, EventKind.TOKEN),
        (CHAT_TOOL_CALL, EventKind.TOKEN),
        (USAGE, EventKind.METADATA),
        (ERROR_500, EventKind.ERROR),
        (ERROR_400, EventKind.ERROR),
        ("[DONE]", EventKind.DONE),
        ("not json at all", EventKind.MALFORMED),
        ('{"choices": [', EventKind.MALFORMED),
        ("", EventKind.MALFORMED),
        ("[1, 2, 3]", EventKind.MALFORMED),
        ('"a string"', EventKind.MALFORMED),
        ("42", EventKind.MALFORMED),
        ("null", EventKind.MALFORMED),
        ("{}", EventKind.METADATA),
    ],
)
def test_classify_kinds(data: str, kind: EventKind) -> None:
    event = classify(data)
    assert event.kind is kind
    assert event.data == data
    if kind in (EventKind.DONE, EventKind.MALFORMED):
        assert event.payload is None
    else:
        assert event.payload == json.loads(data)
    if kind is not EventKind.ERROR:
        assert event.error_status is None
        assert event.error_message is None


def test_token_payload_is_the_parsed_chunk() -> None:
    event = classify(COMPLETION_TOKEN)
    assert event.payload is not None
    assert event.payload["choices"][0]["text"] == "K"


def test_error_500_details() -> None:
    event = classify(ERROR_500)
    assert event.kind is EventKind.ERROR
    assert event.error_status == 500
    assert event.error_message == "Internal server error"


def test_error_400_details() -> None:
    event = classify(ERROR_400)
    assert event.error_status == 400
    assert event.error_message == "max_tokens must be at least 1"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (error_event(with_code=False), DEFAULT_ERROR_STATUS),
        (error_event(None), DEFAULT_ERROR_STATUS),
        (error_event("oops"), DEFAULT_ERROR_STATUS),
        (error_event(3.5), DEFAULT_ERROR_STATUS),
        (error_event(True), DEFAULT_ERROR_STATUS),
        (error_event([500]), DEFAULT_ERROR_STATUS),
        (error_event(200), DEFAULT_ERROR_STATUS),
        (error_event(302), DEFAULT_ERROR_STATUS),
        (error_event(600), DEFAULT_ERROR_STATUS),
        (error_event(-500), DEFAULT_ERROR_STATUS),
        (error_event("503"), 503),
        (error_event(" 429 "), 429),
        (error_event("5030"), DEFAULT_ERROR_STATUS),
        (error_event("٥٠٣"), DEFAULT_ERROR_STATUS),  # non-ASCII digits are not a status
        (error_event(404), 404),
        (error_event(599), 599),
    ],
)
def test_error_status(data: str, status: int) -> None:
    event = classify(data)
    assert event.kind is EventKind.ERROR
    assert event.error_status == status
    assert event.error_message == "boom"


def test_default_error_status_is_502() -> None:
    assert DEFAULT_ERROR_STATUS == 502


def test_error_as_string() -> None:
    event = classify('{"error": "engine overloaded", "code": 503}')
    assert event.kind is EventKind.ERROR
    assert event.error_status == 503
    assert event.error_message == "engine overloaded"


def test_error_object_shape_of_older_vllm() -> None:
    data = json.dumps(
        {"object": "error", "message": "model not found", "type": "NotFoundError", "code": 404}
    )
    event = classify(data)
    assert event.kind is EventKind.ERROR
    assert event.error_status == 404
    assert event.error_message == "model not found"


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ({"type": "InternalServerError", "code": 500}, "InternalServerError"),
        ({"message": "", "type": "X"}, "X"),
        ({"message": {"nested": 1}}, "upstream sent an error event"),
        ({"code": 500}, "upstream sent an error event"),
    ],
)
def test_error_message_fallbacks(error: dict[str, Any], message: str) -> None:
    event = classify(json.dumps({"error": error}))
    assert event.kind is EventKind.ERROR
    assert event.error_message == message


def test_error_wins_over_choices() -> None:
    data = json.dumps({"choices": [{"index": 0, "text": "x"}], "error": {"message": "m"}})
    assert classify(data).kind is EventKind.ERROR


@pytest.mark.parametrize("error", [None, "", {}, False])
def test_falsy_error_key_is_not_an_error(error: Any) -> None:
    data = json.dumps({"choices": [{"index": 0, "text": "x"}], "error": error})
    assert classify(data).kind is EventKind.TOKEN


@pytest.mark.parametrize(
    ("delta", "kind"),
    [
        ({"role": "assistant", "content": ""}, EventKind.METADATA),
        ({"role": "assistant"}, EventKind.METADATA),
        ({"content": None}, EventKind.METADATA),
        ({"content": "é"}, EventKind.TOKEN),
        ({"content": " "}, EventKind.TOKEN),  # whitespace is generated output too
        ({"reasoning_content": ""}, EventKind.METADATA),
        ({"reasoning": "think"}, EventKind.TOKEN),  # newer vLLM's name for reasoning_content
        ({"tool_calls": []}, EventKind.METADATA),
        ({"tool_calls": [{"index": 0}]}, EventKind.TOKEN),
        ({"content": 5}, EventKind.METADATA),
    ],
)
def test_chat_deltas(delta: dict[str, Any], kind: EventKind) -> None:
    data = json.dumps(
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    )
    assert classify(data).kind is kind


def test_token_in_any_choice() -> None:
    data = json.dumps(
        {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}, {"index": 1, "text": "b"}]}
    )
    assert classify(data).kind is EventKind.TOKEN


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": None},
        {"choices": "text"},
        {"choices": [None, 3, "x"]},
        {"choices": [{"text": None}]},
        {"choices": [{"delta": "content"}]},
        {"usage": {"prompt_tokens": 1}},
    ],
)
def test_odd_shapes_are_metadata(payload: dict[str, Any]) -> None:
    assert classify(json.dumps(payload)).kind is EventKind.METADATA


def test_done_tolerates_surrounding_whitespace() -> None:
    assert classify(" [DONE] ").kind is EventKind.DONE
    assert classify("[DONE]x").kind is EventKind.MALFORMED


def test_deeply_nested_json_is_malformed_not_a_crash() -> None:
    assert classify("[" * 100_000 + "]" * 100_000).kind is EventKind.MALFORMED
    assert classify('{"a":' * 100_000 + "1" + "}" * 100_000).kind is EventKind.MALFORMED


def test_events_are_values() -> None:
    """Equal by kind, data and payload (not by whether the wire bytes were kept), hashed
    alike; immutability is the type checker's (``Final``), as for every record."""
    event = classify(CHAT_CONTENT)
    kept = classify(CHAT_CONTENT, f"data: {CHAT_CONTENT}\n\n".encode())
    assert event == kept and hash(event) == hash(kept) and event.encoded is None
    assert {event: 1}[kept] == 1
    assert event != classify(CHAT_ROLE)
    assert event != SseEvent(EventKind.METADATA, CHAT_CONTENT, event.payload)
    assert event != SseEvent(EventKind.TOKEN, CHAT_CONTENT, None)
    assert event != CHAT_CONTENT
    assert repr(SseEvent(EventKind.DONE, "[DONE]")) == (
        "SseEvent(kind=<EventKind.DONE: 'done'>, data='[DONE]', payload=None)"
    )
