"""The bound on a non-streaming answer being assembled (``engine.max_response_bytes``): an answer
of exactly the bound is served; one byte more is the engine's malformed response (502), charged
to it, its stream closed and everything released; streams are not bounded by it."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.assemble import ResponseAssembler
from narwhal.core.requests import COMPLETIONS
from tests.core.scripted import DONE, USAGE_CHUNK, Decode, token
from tests.core.test_lifecycle import D0, D1, assert_clean, charged_engines, serve

CHUNKS = (*(token(f"{i:02d}" + "x" * 60) for i in range(16)), USAGE_CHUNK)
# what the assembler counts: each event's data, without "data: " and the blank line
ANSWER_SIZE = sum(len(chunk) - len(b"data: ") - len(b"\n\n") for chunk in CHUNKS)


def answer() -> Decode:
    return Decode(items=(*((0.001, chunk) for chunk in CHUNKS), (0.0, DONE)))


def test_an_answer_of_exactly_the_bound_is_served() -> None:
    assert ANSWER_SIZE > 1024  # the smallest bound the configuration takes
    out = serve({"decode": [answer()]}, stream=False, max_response_bytes=ANSWER_SIZE)
    assert out.sink.status == 200 and out.sink.body is not None
    assert out.sink.body["choices"][0]["text"].startswith("00xxx")
    assert out.sink.body["usage"]["completion_tokens"] == 3
    assert_clean(out)


def test_one_byte_past_the_bound_is_the_engines_malformed_response() -> None:
    out = serve({"decode": [answer()]}, stream=False, max_response_bytes=ANSWER_SIZE - 1)
    assert out.record is not None and out.record.outcome == "malformed_response"
    assert out.sink.status == 502 and out.sink.body is not None
    message = out.sink.body["error"]["message"]
    assert message == f"engine's answer over engine.max_response_bytes ({ANSWER_SIZE - 1} bytes)"
    assert charged_engines(out) == {out.record.engines[-1]}
    assert_clean(out)  # the engine's stream closed, every reservation released


def test_a_retry_may_serve_an_answer_cut_by_the_bound() -> None:
    small = Decode(items=((0.001, token("A")), (0.0, DONE)))
    out = serve(
        {"decode": [answer(), small]}, stream=False, max_attempts=2, max_response_bytes=1024
    )
    assert out.record is not None and out.record.attempts == 2 and out.sink.status == 200
    assert charged_engines(out) <= {D0, D1} and len(charged_engines(out)) == 1
    assert_clean(out)


def test_a_stream_is_not_bounded_by_it() -> None:
    out = serve({"decode": [answer()]}, stream=True, max_response_bytes=1024)
    assert out.sink.status == 200 and out.sink.sse_events() == [*CHUNKS, DONE]
    assert_clean(out)


@pytest.mark.parametrize("size", [0, 1, 10])
def test_the_assembler_takes_events_up_to_the_bound_and_nothing_past_it(size: int) -> None:
    payload: dict[str, Any] = {"choices": [{"index": 0, "text": "a"}]}
    assembler = ResponseAssembler(COMPLETIONS, max_bytes=10)
    assert assembler.add(payload, 10 - size)
    assert assembler.add(payload, size)  # exactly the bound
    assert not assembler.add(payload, 1)  # one past: refused, not taken
    assert assembler.size == 10 and assembler.result()["choices"][0]["text"] == "aa"
