"""The assembler: a streamed decode becomes vLLM's non-streaming response, losing nothing a
chunk carried (text, reasoning, tool calls, logprobs, finish and stop reasons, usage)."""

from __future__ import annotations

from typing import Any

from narwhal.core.assemble import ResponseAssembler
from narwhal.core.requests import CHAT, COMPLETIONS

HEAD = {"id": "cmpl-1", "created": 7, "model": "m"}


def assemble(endpoint: str, choices: list[list[dict[str, Any]]], **last: Any) -> dict[str, Any]:
    assembler = ResponseAssembler(endpoint, max_bytes=1 << 20)
    for chunk in choices:
        assert assembler.add({**HEAD, "choices": chunk}, 100)
    if last:
        assert assembler.add({**HEAD, "choices": [], **last}, 100)
    return assembler.result()


def token(text: str, offset: int, logprob: float) -> dict[str, Any]:
    return {
        "index": 0,
        "text": text,
        "logprobs": {
            "text_offset": [offset],
            "token_logprobs": [logprob],
            "tokens": [text],
            "top_logprobs": [{text: logprob}],
        },
        "finish_reason": None,
        "stop_reason": None,
    }


def test_completion_text_logprobs_reasons_and_usage() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    last = {**token("b", 1, -0.5), "finish_reason": "stop", "stop_reason": "\n"}
    body = assemble(COMPLETIONS, [[token("a", 0, -0.25)], [last]], usage=usage)
    assert body == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "logprobs": {
                    "text_offset": [0, 1],
                    "token_logprobs": [-0.25, -0.5],
                    "tokens": ["a", "b"],
                    "top_logprobs": [{"a": -0.25}, {"b": -0.5}],
                },
                "finish_reason": "stop",
                "stop_reason": "\n",
            }
        ],
        "usage": usage,
    }


def call(index: int, **fields: Any) -> dict[str, Any]:
    return {"index": 0, "delta": {"tool_calls": [{"index": index, **fields}]}}


def test_streamed_tool_call_fragments_become_whole_calls() -> None:
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    weather = {"name": "get_weather", "arguments": ""}
    body = assemble(
        CHAT,
        [
            [role],
            [call(0, id="call-a", type="function", function=weather)],
            [call(0, function={"arguments": '{"city": '})],
            [call(0, function={"arguments": '"Paris"}'})],
            [call(1, id="call-b", type="function", function={"name": "now", "arguments": "{}"})],
            [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        ],
    )
    (choice,) = body["choices"]
    assert body["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call-a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "call-b", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    assert choice["message"]["content"] == ""  # the role chunk's empty content was sent


def test_a_pure_tool_call_has_null_content_as_vllm_answers() -> None:
    body = assemble(CHAT, [[call(0, id="c", type="function", function={"name": "f"})]])
    assert body["choices"][0]["message"]["content"] is None


def test_reasoning_fields_chat_logprobs_and_choices_are_kept_apart() -> None:
    def delta(index: int, **fields: Any) -> dict[str, Any]:
        return {"index": index, "delta": fields}

    lp = {"content": [{"token": "x", "logprob": -1.0, "bytes": [120], "top_logprobs": []}]}
    body = assemble(
        CHAT,
        [
            [delta(0, reasoning="think "), delta(1, reasoning_content="hm")],
            [{**delta(0, content="x"), "logprobs": lp}, delta(1, content="y")],
            [{**delta(0, content="x"), "logprobs": lp}],
            [{**delta(1), "finish_reason": "length"}, {**delta(0), "finish_reason": "stop"}],
        ],
    )
    first, second = body["choices"]
    assert first["message"] == {"role": "assistant", "content": "xx", "reasoning": "think "}
    assert first["logprobs"] == {"content": lp["content"] * 2}
    assert first["finish_reason"] == "stop"
    assert second["message"] == {"role": "assistant", "content": "y", "reasoning_content": "hm"}
    assert second["logprobs"] is None and second["finish_reason"] == "length"


def test_legacy_function_call_is_merged() -> None:
    first = {"index": 0, "delta": {"function_call": {"name": "f", "arguments": "{"}}}
    rest = {"index": 0, "delta": {"function_call": {"arguments": "}"}}}
    body = assemble(CHAT, [[first], [rest]])
    assert body["choices"][0]["message"]["function_call"] == {"name": "f", "arguments": "{}"}
