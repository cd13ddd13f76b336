"""Tests for narwhal.core.sse's incremental parsing: line endings, splits at any byte, bounds,
the wire form, and properties over generated streams (classification: test_sse_classify.py)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.sse import (
    EventKind,
    SseEvent,
    SseParser,
    SseTooLarge,
    classify,
)
from tests.core.sse_samples import (
    CHAT_CONTENT,
    CHAT_FINISH,
    CHAT_ROLE,
    COMPLETION_TOKEN,
    ERROR_500,
    USAGE,
    cut,
    parse,
    parse_chunks,
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
