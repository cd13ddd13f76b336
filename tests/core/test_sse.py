"""Tests for narwhal.core.sse: classification of vLLM's chunks and incremental SSE parsing."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.sse import (
    DEFAULT_ERROR_STATUS,
    EventKind,
    SseEvent,
    SseParser,
    SseTooLarge,
    classify,
)

# ---------------------------------------------------------------- realistic vLLM chunks
# Shapes as vLLM 0.32.0 sends them (docs/contract.md); compact separators as in vLLM's
# pydantic model_dump_json, json.dumps spacing for the in-band error.

COMPLETION_TOKEN = (
    '{"id":"cmpl-7f3a","object":"text_completion","created":1767225600,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":"K","logprobs":null,"finish_reason":null,"stop_reason":null}],'
    '"usage":null}'
)
COMPLETION_FINISH = (
    '{"id":"cmpl-7f3a","object":"text_completion","created":1767225600,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null}],"usage":null}'
)
CHAT_ROLE = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    '"logprobs":null,"finish_reason":null}]}'
)
CHAT_CONTENT = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"content":"z"},"logprobs":null,'
    '"finish_reason":null}]}'
)
CHAT_FINISH = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{},"logprobs":null,'
    '"finish_reason":"stop","stop_reason":null}]}'
)
CHAT_REASONING = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},'
    '"logprobs":null,"finish_reason":null}]}'
)
CHAT_TOOL_CALL = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    '"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":""}}]},'
    '"logprobs":null,"finish_reason":null}]}'
)
USAGE = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[],'
    '"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8}}'
)
ERROR_500 = (
    '{"error": {"message": "Internal server error", "type": "InternalServerError", '
    '"param": null, "code": 500}}'
)
ERROR_400 = (
    '{"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError", '
    '"param": null, "code": 400}}'
)


def _error(code: Any = None, *, with_code: bool = True, message: Any = "boom") -> str:
    err: dict[str, Any] = {"message": message, "type": "InternalServerError", "param": None}
    if with_code:
        err["code"] = code
    return json.dumps({"error": err})


def parse(stream: bytes) -> list[SseEvent]:
    parser = SseParser()
    events = parser.feed(stream)
    assert parser.close() == []
    return events


def parse_chunks(chunks: list[bytes]) -> tuple[list[SseEvent], SseParser]:
    parser = SseParser()
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    return events, parser


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


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
        (_error(with_code=False), DEFAULT_ERROR_STATUS),
        (_error(None), DEFAULT_ERROR_STATUS),
        (_error("oops"), DEFAULT_ERROR_STATUS),
        (_error(3.5), DEFAULT_ERROR_STATUS),
        (_error(True), DEFAULT_ERROR_STATUS),
        (_error([500]), DEFAULT_ERROR_STATUS),
        (_error(200), DEFAULT_ERROR_STATUS),
        (_error(302), DEFAULT_ERROR_STATUS),
        (_error(600), DEFAULT_ERROR_STATUS),
        (_error(-500), DEFAULT_ERROR_STATUS),
        (_error("503"), 503),
        (_error(" 429 "), 429),
        (_error("5030"), DEFAULT_ERROR_STATUS),
        (_error("٥٠٣"), DEFAULT_ERROR_STATUS),  # non-ASCII digits are not a status
        (_error(404), 404),
        (_error(599), 599),
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


# ---------------------------------------------------------------- parsing


def test_vllm_chat_stream() -> None:
    stream = "".join(
        f"data: {d}\n\n" for d in [CHAT_ROLE, CHAT_CONTENT, CHAT_CONTENT, CHAT_FINISH, USAGE]
    )
    stream += "data: [DONE]\n\n"
    kinds = [e.kind for e in parse(stream.encode())]
    assert kinds == [
        EventKind.METADATA,
        EventKind.TOKEN,
        EventKind.TOKEN,
        EventKind.METADATA,
        EventKind.METADATA,
        EventKind.DONE,
    ]


def test_vllm_in_band_error_stream() -> None:
    stream = f"data: {COMPLETION_TOKEN}\n\ndata: {ERROR_500}\n\ndata: [DONE]\n\n".encode()
    events = parse(stream)
    assert [e.kind for e in events] == [EventKind.TOKEN, EventKind.ERROR, EventKind.DONE]
    assert events[1].error_status == 500


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_line_endings(eol: str) -> None:
    stream = f"data: {CHAT_CONTENT}{eol}{eol}data: [DONE]{eol}{eol}".encode()
    events = parse(stream)
    assert events == [classify(CHAT_CONTENT), classify("[DONE]")]


def test_mixed_line_endings() -> None:
    stream = b"data: a\r\ndata: b\rdata: c\n\r\ndata: [DONE]\r\r"
    assert [e.data for e in parse(stream)] == ["a\nb\nc", "[DONE]"]


def test_crlf_split_across_chunks() -> None:
    events, parser = parse_chunks([b"data: [DONE]\r", b"\n\r", b"\n"])
    assert events == [classify("[DONE]")]
    assert not parser.pending


def test_cr_then_blank_line_in_next_chunk() -> None:
    # The CR ends the data line; the next chunk's first LF pairs with it, the second LF is blank.
    events, _ = parse_chunks([b"data: [DONE]\r", b"\n\n"])
    assert events == [classify("[DONE]")]
    # A CR then CR: two line ends, so the event is dispatched at once.
    events, _ = parse_chunks([b"data: [DONE]\r", b"\r"])
    assert events == [classify("[DONE]")]


def test_lf_after_cr_is_skipped_only_right_after_it() -> None:
    events, parser = parse_chunks([b"data: x\r", b"", b"\n", b"\n"])
    assert events == [classify("x")]
    assert not parser.pending


def test_comments_are_ignored() -> None:
    stream = b": ping\n\n:\n\ndata: [DONE]\n: inside an event\n\n"
    assert parse(stream) == [classify("[DONE]")]


def test_keep_alive_blank_lines_produce_nothing() -> None:
    assert parse(b"\n\n\n\r\n\r\r") == []
    assert parse(b"\n\ndata: [DONE]\n\n\n\n") == [classify("[DONE]")]


def test_event_without_data_is_not_dispatched() -> None:
    assert parse(b"event: message\nid: 7\nretry: 1000\n\n") == []


def test_other_fields_are_ignored() -> None:
    stream = b"event: completion\nid: 1\ndata: [DONE]\nretry: 5\nfoo: bar\nnocolon\n\n"
    assert parse(stream) == [classify("[DONE]")]


def test_field_names_are_case_sensitive_and_exact() -> None:
    assert parse(b"Data: x\ndata : y\ndatax: z\n\n") == []


def test_multi_line_data() -> None:
    events = parse(b'data: {"a":\ndata: 1}\n\n')
    assert len(events) == 1
    assert events[0].data == '{"a":\n1}'
    assert events[0].kind is EventKind.METADATA
    assert events[0].payload == {"a": 1}


def test_leading_space_rule() -> None:
    events = parse(b"data:x\n\ndata: x\n\ndata:  x\n\ndata:\n\ndata\n\ndata: \n\n")
    assert [e.data for e in events] == ["x", "x", " x", "", "", ""]
    assert all(e.kind is EventKind.MALFORMED for e in events)


def test_empty_data_lines_join_with_newlines() -> None:
    assert [e.data for e in parse(b"data\ndata:\ndata: \n\n")] == ["\n\n"]


def test_colon_inside_value() -> None:
    assert [e.data for e in parse(b"data: a: b:c\n\n")] == ["a: b:c"]


def test_many_events_in_one_chunk() -> None:
    stream = b"".join(f"data: {CHAT_CONTENT}\n\n".encode() for _ in range(500))
    events = parse(stream + b"data: [DONE]\n\n")
    assert len(events) == 501
    assert all(e.kind is EventKind.TOKEN for e in events[:500])
    assert events[-1].kind is EventKind.DONE


def test_event_split_mid_line() -> None:
    line = f"data: {COMPLETION_TOKEN}\n\n".encode()
    events, parser = parse_chunks([line[:30], line[30:60], line[60:]])
    assert events == [classify(COMPLETION_TOKEN)]
    assert not parser.pending


@pytest.mark.parametrize("at", range(1, 6))
def test_event_split_mid_field_name(at: int) -> None:
    stream = b"data: [DONE]\n\n"
    events, _ = parse_chunks([stream[:at], stream[at:]])
    assert events == [classify("[DONE]")]


def test_event_split_mid_utf8_character() -> None:
    text = "é中😀"
    data = json.dumps({"choices": [{"index": 0, "text": text}]}, ensure_ascii=False)
    stream = f"data: {data}\n\n".encode()
    for at in range(len(stream) + 1):
        events, _ = parse_chunks([stream[:at], stream[at:]])
        assert len(events) == 1
        assert events[0].payload == {"choices": [{"index": 0, "text": text}]}
        assert events[0].kind is EventKind.TOKEN
    one_byte_at_a_time, _ = parse_chunks([stream[i : i + 1] for i in range(len(stream))])
    assert one_byte_at_a_time == [classify(data)]


def test_invalid_utf8_is_replaced() -> None:
    events = parse(b"data: \xff\xfeok\xe4\n\n")
    assert events[0].data == "\ufffd\ufffdok\ufffd"


def test_leading_bom_is_dropped_only_at_stream_start() -> None:
    assert parse(b"\xef\xbb\xbfdata: [DONE]\n\n") == [classify("[DONE]")]
    events, _ = parse_chunks([b"\xef", b"\xbb", b"\xbfdata: [DONE]\n\n"])
    assert events == [classify("[DONE]")]
    # Later, the same bytes are part of a line: "\ufeffdata" is not the data field.
    assert parse(b"\n\xef\xbb\xbfdata: [DONE]\n\n") == []
    assert parse(b"\xef\xbb\xbf\n\xef\xbb\xbfdata: x\n\n") == []


def test_close_on_truncated_stream() -> None:
    for tail in [b"data: [DO", b"data: [DONE]", b"data: [DONE]\n", b": comm"]:
        parser = SseParser()
        assert parser.feed(b"data: [DONE]\n\n" + tail) == [classify("[DONE]")]
        assert parser.pending
        assert parser.close() == []
        assert parser.pending


def test_close_on_complete_stream() -> None:
    for stream in [b"", b"data: [DONE]\n\n", b"data: [DONE]\n\n\n", b": c\n", b"id: 1\n"]:
        parser = SseParser()
        parser.feed(stream)
        assert not parser.pending
        assert parser.close() == []
        assert not parser.pending


def test_pending_while_streaming() -> None:
    parser = SseParser()
    assert not parser.pending
    parser.feed(b"data: x\n")
    assert parser.pending
    assert parser.feed(b"\n") == [classify("x")]
    assert not parser.pending


def test_feed_after_close_is_an_error() -> None:
    parser = SseParser()
    parser.close()
    with pytest.raises(RuntimeError):
        parser.feed(b"data: x\n\n")


def test_max_event_bytes() -> None:
    parser = SseParser(max_event_bytes=64)
    assert parser.feed(b"data: " + b"x" * 40 + b"\n\n") == [classify("x" * 40)]
    with pytest.raises(SseTooLarge):
        parser.feed(b"data: " + b"y" * 70)  # an unterminated line that never ends
    parser = SseParser(max_event_bytes=64)
    parser.feed(b"data: " + b"z" * 30 + b"\n")
    with pytest.raises(SseTooLarge):
        parser.feed(b"data: " + b"z" * 30 + b"\n")  # data lines of one event add up


@pytest.mark.timeout(30)
def test_long_stream_in_small_chunks_is_linear() -> None:
    # One 2 MiB line fed 16 bytes at a time: a parser that rescans or re-joins its growing buffer
    # on each chunk does about 2**17 * 1 MiB of copying here (minutes, and pytest-timeout
    # stops it); a linear one takes a fraction of a second.
    payload = "a" * (2 * 1024 * 1024)
    stream = f"data: {payload}\n\n".encode()
    parser = SseParser()
    started = time.perf_counter()
    events: list[SseEvent] = []
    for i in range(0, len(stream), 16):
        events.extend(parser.feed(stream[i : i + 16]))
    elapsed = time.perf_counter() - started
    assert [e.data for e in events] == [payload]
    assert elapsed < 20


# ---------------------------------------------------------------- wire


@pytest.mark.parametrize(
    "data",
    [COMPLETION_TOKEN, CHAT_ROLE, USAGE, ERROR_500, "[DONE]", "garbage", "", " lead", "a\nb", "\n"],
)
def test_wire_reparses_to_the_same_event(data: str) -> None:
    event = classify(data)
    assert parse(event.wire()) == [event]


def test_wire_format() -> None:
    assert classify("[DONE]").wire() == b"data: [DONE]\n\n"
    assert classify(ERROR_500).wire() == f"data: {ERROR_500}\n\n".encode()
    assert classify("a\nb").wire() == b"data: a\ndata: b\n\n"
    assert classify("é").wire() == "data: é\n\n".encode()


def test_wire_normalises_cr_in_hand_built_data() -> None:
    assert classify("a\r\nb\rc").wire() == b"data: a\ndata: b\ndata: c\n\n"


# ---------------------------------------------------------------- properties

_text = st.text(st.characters(codec="utf-8"), max_size=8)
_line_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
_code = st.one_of(
    st.none(), st.integers(-1, 700), st.sampled_from(["503", "abc", "400", ""]), _text
)


@st.composite
def _payload(draw: st.DrawFn) -> str:
    """The data of one event: the JSON vLLM sends, or something malformed."""
    kind = draw(st.sampled_from(["completion", "chat", "role", "usage", "error", "done", "other"]))
    if kind == "completion":
        choice = {"index": 0, "text": draw(_text), "finish_reason": None}
        return json.dumps({"object": "text_completion", "choices": [choice]}, ensure_ascii=False)
    if kind == "chat":
        delta = {"content": draw(_text)}
        chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
        return json.dumps(chunk, ensure_ascii=False)
    if kind == "role":
        return CHAT_ROLE
    if kind == "usage":
        return USAGE
    if kind == "error":
        err = {"message": draw(_text), "type": "InternalServerError", "code": draw(_code)}
        return json.dumps({"error": err}, ensure_ascii=False)
    if kind == "done":
        return "[DONE]"
    return "\n".join(draw(st.lists(_line_text, min_size=1, max_size=3)))


# An item of a stream: ("data", [lines]) is an event; ("comment", text), ("field", line) and
# ("blank", "") are lines that produce no event. Comments and other fields may also sit between
# the data lines of an event.
_noise = st.one_of(
    st.tuples(st.just("comment"), _line_text),
    st.tuples(st.just("field"), st.sampled_from(["event: message", "id: 3", "retry: 10", "x"])),
)
_item = st.one_of(
    st.tuples(st.just("data"), _payload()),
    _noise,
    st.tuples(st.just("blank"), st.just("")),
)
_eol = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _stream(draw: st.DrawFn) -> tuple[bytes, list[SseEvent]]:
    """An encoded event stream and the events it must yield."""
    lines: list[str] = []
    expected: list[SseEvent] = []
    for kind, value in draw(st.lists(_item, max_size=12)):
        if kind == "comment":
            lines.append(":" + value)
        elif kind == "field":
            lines.append(value)
        elif kind == "blank":
            lines.append("")
        else:
            for i, data_line in enumerate(value.split("\n")):
                if i and draw(st.booleans()):
                    noise_kind, noise = draw(_noise)
                    lines.append(":" + noise if noise_kind == "comment" else noise)
                if data_line == "" and draw(st.booleans()):
                    lines.append("data")
                elif data_line.startswith(" ") or draw(st.booleans()):
                    lines.append("data: " + data_line)
                else:
                    lines.append("data:" + data_line)
            lines.append("")
            expected.append(classify(value))
    out: list[str] = []
    previous = ""
    for line in lines:
        eol = draw(_eol)
        if previous == "\r" and line == "" and eol == "\n":
            eol = "\r\n"  # a lone LF right after a CR would merge with it into one line end
        out.append(line + eol)
        previous = eol
    return "".join(out).encode("utf-8"), expected


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.data())
def test_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    stream, expected = data.draw(_stream())
    whole, parser = parse_chunks([stream])
    assert whole == expected
    assert not parser.pending
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    chunked, parser = parse_chunks(cut(stream, points))
    assert chunked == expected
    assert not parser.pending
    assert parser.close() == []


@settings(derandomize=True, max_examples=60, deadline=None)
@given(_stream())
def test_byte_at_a_time_gives_the_same_events(generated: tuple[bytes, list[SseEvent]]) -> None:
    stream, expected = generated
    events, parser = parse_chunks([stream[i : i + 1] for i in range(len(stream))])
    assert events == expected
    assert not parser.pending


@settings(derandomize=True, max_examples=150, deadline=None)
@given(st.data())
def test_a_prefix_yields_a_prefix_of_the_events(data: st.DataObject) -> None:
    stream, expected = data.draw(_stream())
    end = data.draw(st.integers(0, len(stream)))
    events, parser = parse_chunks([stream[:end]])
    assert events == expected[: len(events)]
    assert parser.close() == []
    if end and stream[end - 1] not in b"\r\n":
        assert parser.pending  # an unterminated line is held
    if end == len(stream):
        assert not parser.pending


@settings(derandomize=True, max_examples=200, deadline=None)
@given(_payload())
def test_wire_round_trip(data: str) -> None:
    event = classify(data)
    assert parse(event.wire()) == [event]


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=30))
def test_wire_round_trip_any_text(data: str) -> None:
    event = classify(data)
    assert parse(event.wire()) == [event]


def test_a_repeated_chunk_means_what_it_meant_and_only_from_a_clean_state() -> None:
    a = b'data: {"choices":[{"text":"a"}]}\n\n'
    b = b'data: {"choices":[{"text":"b"}]}\n\n'
    c = b'data: {"choices":[{"text":""}]}\n\n'
    parser = SseParser()
    first = parser.feed(a)
    assert parser.feed(a) == first
    assert [e.data for e in parser.feed(b + c)] == [b[6:-2].decode(), c[6:-2].decode()]
    assert parser.feed(a) == first  # not the last event classified (c): the chunk's own
    assert parser.feed(a[:10]) == []  # held: the same bytes next are not a whole event
    assert [e.data for e in parser.feed(a)] == [(a[:10] + a)[6:].split(b"\n")[0].decode()]
    assert parser.feed(a) == first


def test_event_json_is_read_like_any_json_the_router_parses() -> None:
    # one parser for everything from the network (core.jsonparse): blanks around a value are
    # fine; trailing data, a second value or an escaped lone surrogate make the event malformed
    assert classify(' {"choices": [{"text": "a"}]} ').kind is EventKind.TOKEN
    assert classify('{"choices": [{"text": "a"}]} x').kind is EventKind.MALFORMED
    assert classify('{"a": 1}{"b": 2}').kind is EventKind.MALFORMED
    assert classify('{"choices": [{"text": "\\ud800"}]}').kind is EventKind.MALFORMED


def test_an_event_repeated_whole_is_the_same_event_and_a_repeat_split_is_parsed() -> None:
    wire = f"data: {COMPLETION_TOKEN}\n\n".encode()
    parser = SseParser()
    first = parser.feed(wire)
    assert parser.feed(wire)[0] is first[0]
    assert parser.feed(b"") == []
    half = len(wire) // 2
    assert parser.feed(wire[:half]) == []
    # with bytes held, the whole event again is not taken for a repeat: it ends a longer line
    assert [e.kind for e in parser.feed(wire)] == [EventKind.MALFORMED]
    assert parser.feed(wire) == [classify(COMPLETION_TOKEN)]


def test_whole_events_are_the_fast_path_and_change_nothing_feed_depends_on() -> None:
    token = f"data: {COMPLETION_TOKEN}\n\n".encode()
    looked, plain = SseParser(), SseParser()
    events = looked.whole_events(token + b"data: [DONE]\n\n")
    assert events is not None and [e.kind for e in events] == [EventKind.TOKEN, EventKind.DONE]
    assert events == plain.feed(token + b"data: [DONE]\n\n")
    for not_whole in (token[:-1], b"event: x\ndata: y\n\n", token.replace(b"\n\n", b"\r\n\r\n")):
        assert looked.whole_events(not_whole) is None
    looked.feed(token[:10])  # part of an event is held: nothing after it is whole on its own
    assert looked.whole_events(token) is None
    assert [e.data for e in looked.feed(token[10:])] == [COMPLETION_TOKEN]
