"""Chat streams in the core's resume decision (narwhal.core.resume with
narwhal.core.chat_resume): where a chat's prompt ids are read, what its continuation asks of the
completions endpoint, how the continuation's chunks become chat chunks, the chat refusals, and
the clean end of a stream that got every token whatever else refuses a resume."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.core.chat_resume import CHAT_ONLY_FIELDS
from narwhal.core.config import RecoverySettings
from narwhal.core.errors import FaultKind, fault
from narwhal.core.records import DecisionLog
from narwhal.core.requests import CHAT, COMPLETIONS, ClientRequest
from narwhal.core.resume import END, REFUSE, RESUME, StreamResume, resumable
from narwhal.core.retry import Deadline, RetryBudget
from narwhal.core.sse import SseEvent, classify

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT_BODY = {
    "model": "m",
    "messages": MESSAGES,
    "max_completion_tokens": 10,
    "min_tokens": 4,
    "stream": True,
    "temperature": 0,
    "chat_template_kwargs": {"x": 1},
    "add_generation_prompt": True,
}
SILENCE = fault(FaultKind.SILENCE, "silent", engine="http://d", phase="decode")


def chat_request(**changes: Any) -> ClientRequest:
    body = {**CHAT_BODY, **changes}
    return ClientRequest("r1", CHAT, {k: v for k, v in body.items() if v is not None}, 0.0)


def event(payload: dict[str, Any]) -> SseEvent:
    return classify(json.dumps(payload, separators=(",", ":")))  # compact, as vLLM writes it


def role_chunk(prompt_ids: list[int] | None) -> SseEvent:
    payload: dict[str, Any] = {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    if prompt_ids is not None:
        payload["prompt_token_ids"] = prompt_ids  # vLLM's chat: at the chunk's top level
    return event(payload)


def chat_chunk(ids: list[int], delta: dict[str, Any], finish: str | None = None) -> SseEvent:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return event(
        {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 7,
            "model": "m",
            "choices": [{**choice, "token_ids": ids}],
        }
    )


def decide(resume: StreamResume, now: float = 1.0, **recovery: Any) -> str:
    settings = RecoverySettings(resume_streams=True, **recovery)
    return resume.after_failure(
        SILENCE, now, Deadline(10.0), settings, RetryBudget(0.0, 1), DecisionLog()
    )


def test_a_chat_is_continued_as_completions_from_the_ids_the_engine_reported() -> None:
    resume = StreamResume(chat_request(logprobs=False), None)
    first = resume.leg_request()
    assert first.endpoint == CHAT and first.body["return_token_ids"] is True
    assert first.body["messages"] == MESSAGES
    resume.saw(role_chunk([1, 2, 3]))
    resume.saw(chat_chunk([10, 11], {"content": "ab"}))
    assert resume.prompt_ids == [1, 2, 3] and resume.delivered == [10, 11]
    assert decide(resume) == RESUME
    leg = resume.leg_request()
    assert leg.endpoint == COMPLETIONS
    assert leg.body["prompt"] == [1, 2, 3, 10, 11]
    assert (leg.body["max_tokens"], leg.body["min_tokens"]) == (8, 2)
    assert not set(leg.body) & CHAT_ONLY_FIELDS  # (the messages were rendered already)
    assert "logprobs" not in leg.body  # a chat's flag, not a completion's count
    assert (leg.body["temperature"], leg.body["return_token_ids"]) == (0, True)
    assert chat_request().body["messages"] == MESSAGES  # the client's request is not changed


def test_a_chat_without_a_limit_runs_to_the_stated_sequence_length_or_is_refused() -> None:
    open_ended = chat_request(max_completion_tokens=None)
    unstated = StreamResume(open_ended, None)
    unstated.saw(role_chunk([1, 2, 3]))
    unstated.saw(chat_chunk([10], {"content": "a"}))
    assert decide(unstated) == REFUSE and unstated.refused == "open_ended"
    stated = resumable(open_ended, enabled=True, max_seq_len=100)
    assert stated is not None
    stated.saw(role_chunk([1, 2, 3]))
    stated.saw(chat_chunk([10], {"content": "a"}))
    assert decide(stated, resume_max_seq_len=100) == RESUME
    # vLLM's default for the original: 100 - 3 prompt; one token delivered
    assert stated.leg_request().body["max_tokens"] == 96
    legacy = resumable(chat_request(max_completion_tokens=None, max_tokens=6), enabled=True)
    assert legacy is not None and legacy.output_limit() == 6


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param({"reasoning": "hmm"}, id="reasoning"),
        pytest.param({"reasoning_content": "hmm"}, id="reasoning-content"),
        pytest.param({"tool_calls": [{"index": 0}]}, id="tool-calls"),
        pytest.param({}, id="ids-without-content"),  # a parser held their text back
    ],
)
def test_a_delta_shaped_by_an_engine_parser_refuses_the_resume(delta: dict[str, Any]) -> None:
    resume = StreamResume(chat_request(), None)
    resume.saw(role_chunk([1, 2]))
    resume.saw(chat_chunk([10], {"content": "a"}))
    resume.saw(chat_chunk([11], delta))
    assert decide(resume) == REFUSE and resume.refused == "parser"


def test_a_chat_without_prompt_ids_is_refused() -> None:
    resume = StreamResume(chat_request(), None)
    resume.saw(role_chunk(None))
    resume.saw(chat_chunk([10], {"content": "a"}))
    assert decide(resume) == REFUSE and resume.refused == "no_token_ids"


def completion_payload(text: str, ids: list[int], finish: str | None = None) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": ids,
    }
    return {
        "id": "cmpl-y",
        "object": "text_completion",
        "created": 9,
        "model": "m",
        "choices": [choice],
    }


@pytest.mark.parametrize("asked", [False, True], ids=["ids-not-asked", "ids-asked"])
def test_the_continuations_chunks_reach_the_client_as_its_chat_chunks(asked: bool) -> None:
    resume = StreamResume(chat_request(return_token_ids=True if asked else None), None)
    role = role_chunk([1, 2])
    resume.saw(role)
    first_role = json.loads(resume.wire(role)[6:])
    assert ("prompt_token_ids" in first_role) is asked  # the router's own ids are cut
    resume.saw(chat_chunk([10], {"content": "a"}))
    decide(resume)
    middle = event({**completion_payload("b", [11]), "prompt_token_ids": None})
    resume.saw(middle)
    choice: dict[str, Any] = {"index": 0, "delta": {"content": "b"}, "logprobs": None}
    expected_ids = {"token_ids": [11]} if asked else {}
    assert json.loads(resume.wire(middle)[6:]) == {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        "choices": [{**choice, "finish_reason": None, **expected_ids}],
    }
    last = event(completion_payload("c", [12], finish="length"))
    resume.saw(last)
    ended = json.loads(resume.wire(last)[6:])["choices"][0]
    assert (ended["finish_reason"], ended["stop_reason"]) == ("length", None)
    usage = event(
        {"id": "cmpl-y", "object": "text_completion", "created": 9, "model": "m",
         "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}
    )  # fmt: skip
    resume.saw(usage)
    counted = json.loads(resume.wire(usage)[6:])
    assert (counted["object"], counted["id"], counted["choices"]) == (
        "chat.completion.chunk",
        "chatcmpl-x",
        [],
    )
    assert counted["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_every_token_delivered_ends_cleanly_whatever_would_refuse_a_resume() -> None:
    """The client has every token: no resume is needed, so neither the deadline, the budget,
    nor a request option that refuses replays turns the lost end into an error."""
    capped = StreamResume(chat_request(max_completion_tokens=2), None)
    capped.saw(role_chunk([1, 2]))
    capped.saw(chat_chunk([10, 11], {"content": "ab"}))  # the limit, no finish_reason seen
    assert decide(capped, now=11.0) == END  # the deadline has passed
    assert capped.refused is None and capped.resumes == 0
    stopped = resumable(chat_request(stop=["zz"]), enabled=True)  # stop strings: refused
    assert stopped is not None and stopped.static == "stop"
    stopped.saw(chat_chunk([10], {"content": "a"}))
    assert decide(stopped) == REFUSE and stopped.refused == "stop"
    stopped.saw(chat_chunk([2], {"content": ""}, finish="stop"))
    assert decide(stopped) == END
    assert stopped.ending() == b"data: [DONE]\n\n"  # no usage asked
    usage = StreamResume(chat_request(stream_options={"include_usage": True}), None)
    usage.saw(role_chunk([1, 2]))
    usage.saw(chat_chunk([10], {"content": "a"}, finish="stop"))
    written = json.loads(usage.ending().split(b"\n\n")[0][6:])
    assert written["object"] == "chat.completion.chunk" and written["id"] == "chatcmpl-x"
    assert written["usage"]["completion_tokens"] == 1
