"""The core's resume decision (narwhal.core.resume), value by value: which requests could be
replayed exactly, what a resumed leg asks for, how its events reach the client, and the order
of the refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.core.config import RecoverySettings
from narwhal.core.errors import FaultKind, fault
from narwhal.core.records import DecisionLog
from narwhal.core.requests import CHAT, COMPLETIONS, ClientRequest
from narwhal.core.resume import (
    REFUSAL_REASONS,
    StreamResume,
    resumable,
    static_refusal,
    without_ids,
)
from narwhal.core.retry import Deadline, RetryBudget
from narwhal.core.sse import classify

BODY = {"model": "m", "prompt": "hi", "max_tokens": 10, "min_tokens": 4, "stream": True}


def request(endpoint: str = COMPLETIONS, **changes: Any) -> ClientRequest:
    return ClientRequest("r1", endpoint, {**BODY, **changes}, 0.0)


def chunk(ids: list[int], text: str, **choice: Any) -> Any:
    payload = {
        "id": "cmpl-x",
        "created": 7,
        "choices": [{"index": 0, "text": text, "token_ids": ids, **choice}],
    }
    return classify(json.dumps(payload, separators=(",", ":")))  # compact, as vLLM writes it


@pytest.mark.parametrize(
    ("endpoint", "changes", "reason"),
    [
        (COMPLETIONS, {}, None),
        (COMPLETIONS, {"response_format": {"type": "text"}, "n": 1, "stop": []}, None),
        (CHAT, {}, None),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, None),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "media"),
        (CHAT, {"thinking_token_budget": 10}, "reasoning"),
        (CHAT, {"tools": [{"type": "function"}]}, "guided"),
        (CHAT, {"logprobs": True, "top_logprobs": 2}, "logprobs"),
        (CHAT, {"echo": True}, "echo"),
        (COMPLETIONS, {"guided_json": {"type": "object"}}, "guided"),
        (COMPLETIONS, {"response_format": {"type": "json_object"}}, "guided"),
        (COMPLETIONS, {"tools": [{"type": "function"}]}, "guided"),
        (COMPLETIONS, {"n": 2}, "n"),
        (COMPLETIONS, {"best_of": 3}, "n"),
        (COMPLETIONS, {"logprobs": 0}, "logprobs"),
        (COMPLETIONS, {"echo": True}, "echo"),
        (COMPLETIONS, {"stop": ["\n"]}, "stop"),
        (COMPLETIONS, {"frequency_penalty": 0.5}, "penalties"),
    ],
)
def test_what_a_replay_could_not_rebuild_is_refused(
    endpoint: str, changes: dict[str, Any], reason: str | None
) -> None:
    assert static_refusal(request(endpoint, **changes)) == reason
    assert reason is None or reason in REFUSAL_REASONS


def test_off_or_not_streaming_nothing_is_followed() -> None:
    assert resumable(request(), enabled=False) is None
    assert resumable(request(stream=False), enabled=True) is None
    refused = resumable(request(stop=["x"]), enabled=True)
    assert refused is not None and refused.leg_request().body == request(stop=["x"]).body


def test_the_resumed_leg_replays_ids_and_asks_for_what_is_left() -> None:
    resume = StreamResume(request(), None)
    first = resume.leg_request().body
    assert first["return_token_ids"] is True and first["prompt"] == "hi"
    resume.saw(chunk([10, 11], "ab", prompt_token_ids=[1, 2, 3]))
    resume.saw(chunk([12], "c"))
    assert resume.prompt_ids == [1, 2, 3] and resume.delivered == [10, 11, 12]
    resume.first_leg = False
    body = resume.leg_request().body
    assert body["prompt"] == [1, 2, 3, 10, 11, 12]
    assert (body["max_tokens"], body["min_tokens"]) == (7, 1)
    assert resume.remaining() == 7
    resume.saw(chunk([13], "d"))
    assert "min_tokens" not in resume.leg_request().body  # reached: no longer asked
    assert request().body["prompt"] == "hi"  # the client's request is never changed


def test_a_resumed_legs_events_join_the_clients_stream() -> None:
    resume = StreamResume(request(), None)
    event = chunk([10], "a", prompt_token_ids=[1, 2])
    resume.saw(event)
    # the first leg: as sent, less the ids the client did not ask for
    assert json.loads(resume.wire(event)[6:])["choices"] == [{"index": 0, "text": "a"}]
    resume.first_leg = False
    other = classify(
        json.dumps(
            {
                "id": "cmpl-y",
                "created": 9,
                "choices": [{"index": 0, "text": "b", "prompt_token_ids": [1, 2, 10]}],
            }
        )
    )
    rewritten = json.loads(resume.wire(other)[6:])
    assert (rewritten["id"], rewritten["created"]) == ("cmpl-x", 7)
    assert rewritten["choices"] == [{"index": 0, "text": "b"}]
    usage = classify(json.dumps({"id": "cmpl-y", "choices": [], "usage": {"prompt_tokens": 3}}))
    counted = json.loads(resume.wire(usage)[6:])["usage"]
    assert counted == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}


def test_the_decision_refuses_in_order_and_takes_the_budget() -> None:
    recovery = RecoverySettings(resume_streams=True, max_resumes=1, resume_max_seq_len=5)
    budget, log = RetryBudget(0.0, 1), DecisionLog()
    silence = fault(FaultKind.SILENCE, "silent", engine="http://d", phase="decode")
    resume = StreamResume(request(), None)

    def decide(failure: Any = silence, now: float = 1.0) -> str | None:
        resume.after_failure(failure, now, Deadline(10.0), recovery, budget, log)
        return resume.refused

    assert decide() == "no_token_ids"  # nothing reported yet
    resume.saw(chunk([10], "a", prompt_token_ids=[1, 2]))
    four_xx = fault(FaultKind.INBAND_ERROR, "bad", engine="http://d", phase="decode", status=400)
    assert decide(four_xx) == "fault"
    assert decide(now=11.0) == "deadline"
    budget.try_acquire()  # the floor of one is taken
    assert decide() == "retry_budget"
    budget.release()
    assert decide() is None and resume.resumes == 1 and budget.active_retries == 1
    assert decide() == "max_resumes"
    recovery = RecoverySettings(max_resumes=2, resume_max_seq_len=2)
    assert decide() == "sequence_length"  # 2 prompt + 1 delivered > 2
    outcomes = [(d.as_dict()["outcome"], d.as_dict()["reason"]) for d in log.entries]
    assert outcomes[-3:] == [("resumed", "silence"), ("refused", "max_resumes"),
                             ("refused", "sequence_length")]  # fmt: skip


def test_the_clients_asked_ids_pass_and_only_the_first_legs_prompt_ids() -> None:
    resume = StreamResume(request(return_token_ids=True), None)
    event = chunk([10], "a", prompt_token_ids=[1, 2])
    resume.saw(event)
    assert resume.wire(event) == event.wire()
    resume.first_leg = False
    later = chunk([11], "b", prompt_token_ids=[1, 2, 10])
    assert json.loads(resume.wire(later)[6:])["choices"][0]["token_ids"] == [11]
    assert "prompt_token_ids" not in json.loads(resume.wire(later)[6:])["choices"][0]


@pytest.mark.parametrize(
    ("raw", "left"),
    [
        (
            b'{"choices":[{"text":"a","stop_reason":null,"prompt_token_ids":[1,2],"token_ids":[3]}]}',
            b'{"choices":[{"text":"a","stop_reason":null}]}',
        ),
        (b'{"choices":[{"text":"a","token_ids":null}]}', b'{"choices":[{"text":"a"}]}'),
        # a text that spells the field is inside a string, its quotes escaped: kept
        (
            b'{"choices":[{"text":",\\"token_ids\\":[1]","token_ids":[9,10]}]}',
            b'{"choices":[{"text":",\\"token_ids\\":[1]"}]}',
        ),
        (b'{"choices":[{"text":"a"}]}', b'{"choices":[{"text":"a"}]}'),
    ],
)
def test_token_ids_are_cut_from_the_bytes_as_written(raw: bytes, left: bytes) -> None:
    assert without_ids(raw) == left
    json.loads(left)  # still JSON


def test_ids_written_with_other_spacing_are_removed_by_re_encoding() -> None:
    resume = StreamResume(request(), None)
    spaced = classify(json.dumps({"id": "c", "choices": [{"text": "a", "token_ids": [1]}]}))
    assert json.loads(resume.wire(spaced)[6:]) == {"id": "c", "choices": [{"text": "a"}]}


def test_a_finish_reason_means_nothing_is_left_and_the_router_ends_with_the_usage() -> None:
    usage_asked = request(stream_options={"include_usage": True}, max_tokens=None)
    resume = StreamResume(usage_asked, None)
    resume.saw(chunk([10], "a", prompt_token_ids=[1, 2, 3]))
    assert resume.remaining() == 15  # no max_tokens: vLLM's completions default of 16
    resume.saw(chunk([2], "", finish_reason="stop"))  # an end-of-sequence id, delivered
    assert resume.remaining() == 0
    ending = resume.ending()
    assert ending.endswith(b"data: [DONE]\n\n") and ending.count(b"data: ") == 2
    usage = json.loads(ending.split(b"\n\n")[0][6:])
    assert usage["choices"] == [] and (usage["id"], usage["created"]) == ("cmpl-x", 7)
    assert usage["usage"] == {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
    resume.saw(classify(json.dumps({"id": "cmpl-x", "choices": [], "usage": usage["usage"]})))
    assert resume.ending() == b"data: [DONE]\n\n"  # the engine's usage chunk was sent
    assert StreamResume(request(), None).ending() == b"data: [DONE]\n\n"  # not asked
