"""Resumable chat streams over real loopback HTTP: a consumer scripted to die mid chat stream,
the same client stream continued on another consumer as a completions request from the chat
prompt's ids the engine reported, and the client's assembled content compared with an
uninterrupted run's (the emulator generates autoregressively: a continuation off by one token,
or from re-rendered text, differs). Also the clean end of a stream that got every token though
its resume was refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from narwhal.emulator.text import completion_tokens, prompt_text, token_ids
from tests.live.conftest import Emulator, RouterHandle, metric_value
from tests.live.test_resume import (
    DIE_AFTER,
    FAULTS,
    MAX_TOKENS,
    MESSAGES,
    fleet,
    same_but_ids,
    stream_bytes,
    text_of,
    uninterrupted,
    until_placed_on_the_dying,
)

CHAT_PROMPT = prompt_text({"messages": MESSAGES}, chat=True)  # as the emulator's template


def assert_one_chat_stream(events: list[Any]) -> list[dict[str, Any]]:
    """The events are one chat stream: one id, created and model, every chunk a chat chunk, one
    role chunk (the first), choice index 0, one final [DONE], no error; its chunks."""
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [e for e in events if isinstance(e, dict)]
    assert not [e for e in chunks if "error" in e]
    assert {(e["id"], e["created"], e["model"]) for e in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], "tiny-llama")
    }
    assert {e["object"] for e in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["id"].startswith("chatcmpl-")
    roles = [c for e in chunks for c in e["choices"] if "role" in c["delta"]]
    assert len(roles) == 1 and roles[0] is chunks[0]["choices"][0]
    assert all(c["index"] == 0 for e in chunks for c in e["choices"])
    return chunks


@pytest.mark.parametrize(("fault", "kind"), FAULTS)
def test_a_consumer_dying_mid_chat_stream_is_resumed_with_the_uninterrupted_content(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    fault: dict[str, Any],
    kind: str,
) -> None:
    dying, healthy, handle = fleet(emulator, router)
    dying.faults({**fault, "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(
        handle, dying, chat=True, stream_options={"include_usage": True}
    )
    assert text_of(events) == uninterrupted(chat=True)
    chunks = assert_one_chat_stream(events)
    finishes = [c["finish_reason"] for e in chunks for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    usage = chunks[-1]["usage"]  # the whole stream's, counting the chat prompt's tokens
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == len(CHAT_PROMPT) + 1
    assert not [e for e in chunks if "prompt_token_ids" in e]  # the router's own ids: cut
    assert not [c for e in chunks for c in e["choices"] if "token_ids" in c or "text" in c]
    assert metric_value(
        handle.metrics(), "narwhal_stream_resumes_total", outcome="resumed", reason=kind
    )
    assert record["status"] == 200 and record["outcome"] == "ok"
    assert record["resumes"] == 1 and record["output_tokens"] == MAX_TOKENS
    assert record["engines"][1:] == [dying.url, record["engines"][0], healthy.url]


def test_a_chat_that_asked_for_token_ids_gets_them_continuous_and_its_prompts_once(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    dying, _healthy, handle = fleet(emulator, router)
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(handle, dying, chat=True, return_token_ids=True)
    assert record["resumes"] == 1 and text_of(events) == uninterrupted(chat=True)
    chunks = assert_one_chat_stream(events)
    tokens = completion_tokens(CHAT_PROMPT, MAX_TOKENS)
    ids = [i for e in chunks for c in e["choices"] for i in c.get("token_ids") or []]
    assert ids == [i for token in tokens for i in token_ids(token, bos=False)]
    # the chat prompt's ids, once, at the role chunk's top level (where vLLM writes them)
    assert [e["prompt_token_ids"] for e in chunks if "prompt_token_ids" in e] == [
        token_ids(CHAT_PROMPT)
    ]
    assert "prompt_token_ids" in chunks[0]


def test_an_open_ended_chat_resumes_to_the_stated_context_length(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    """No limit: vLLM (and the emulator) run a chat to max_model_len less the prompt; stated
    as ``resume_max_seq_len``, the continuation asks for exactly what was left of that."""
    context = len(CHAT_PROMPT) + 1 + 30  # room for 30 tokens
    producer = emulator("prefill", seed=1, max_model_len=context)
    dying = emulator("decode", seed=2, max_model_len=context)
    healthy = emulator("decode", seed=3, max_model_len=context)
    handle = router(
        [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": dying.url, "role": "decode"},
            {"url": healthy.url, "role": "decode"},
        ],
        recovery={
            "eject_after": 1000,
            "probe_interval_s": 60.0,
            "resume_streams": True,
            "resume_max_seq_len": context,
        },
    )
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(handle, dying, True, 30, max_tokens=None)
    assert record["resumes"] == 1 and text_of(events) == uninterrupted(30, chat=True)
    assert_one_chat_stream(events)


def test_an_open_ended_chat_without_a_stated_length_is_refused(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    dying, _healthy, handle = fleet(emulator, router)
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    whole = 2048 - len(CHAT_PROMPT) - 1  # the emulator's max_model_len less the prompt
    events, record = until_placed_on_the_dying(handle, dying, True, whole, max_tokens=None)
    assert "error" in events[-1] and "[DONE]" not in events
    assert record["resume_refused"] == "open_ended" and record["attempts"] == 1
    assert metric_value(
        handle.metrics(), "narwhal_stream_resumes_total", outcome="refused", reason="open_ended"
    )


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="plain"),
        pytest.param({"stream_options": {"include_usage": True}}, id="usage"),
        pytest.param({"return_token_ids": True}, id="client-asked-ids"),
    ],
)
def test_an_unfailed_chat_stream_reaches_the_client_byte_for_byte_as_with_resuming_off(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    extra: dict[str, Any],
) -> None:
    def pair(resume: bool) -> RouterHandle:
        producer, consumer = emulator("prefill", seed=1), emulator("decode", seed=2)
        engines = [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": consumer.url, "role": "decode"},
        ]
        return router(engines, recovery={"resume_streams": resume})

    with_resume = stream_bytes(pair(True), chat=True, **extra)
    without = stream_bytes(pair(False), chat=True, **extra)
    assert same_but_ids(with_resume) == same_but_ids(without)
    assert (b'"token_ids"' in with_resume) is ("return_token_ids" in extra)


@pytest.mark.parametrize(
    ("chat", "extra", "recovery", "reason"),
    [
        pytest.param(False, {}, {"max_resumes": 0}, "max_resumes", id="completions-max-resumes"),
        pytest.param(False, {"stop": ["zz"]}, {}, "stop", id="completions-stop"),
        pytest.param(True, {}, {"max_resumes": 0}, "max_resumes", id="chat-max-resumes"),
    ],
)
def test_a_stream_that_got_every_token_ends_cleanly_though_a_resume_would_be_refused(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    chat: bool,
    extra: dict[str, Any],
    recovery: dict[str, Any],
    reason: str,
) -> None:
    dying, _healthy, handle = fleet(emulator, router, **recovery)
    # the same options, a few tokens short of the end: refused, the terminal event
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(handle, dying, chat=chat, **extra)
    assert "error" in events[-1] and record["resume_refused"] == reason
    # every token, the end lost: the router ends the stream itself, with the usage asked
    dying.faults({"kind": "disconnect", "after_tokens": MAX_TOKENS})
    usage = {"stream_options": {"include_usage": True}}
    events, record = until_placed_on_the_dying(handle, dying, chat=chat, **extra, **usage)
    assert text_of(events) == uninterrupted(chat=chat)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert not [e for e in events if isinstance(e, dict) and "error" in e]
    assert record["status"] == 200 and record["outcome"] == "ok" and record["attempts"] == 1
    assert record.get("resume_refused") is None
    if reason == "stop":  # sent as the client wrote it: the router holds no ids to count
        assert not [e for e in events if isinstance(e, dict) and e.get("usage")]
    else:
        assert events[-2]["usage"]["completion_tokens"] == MAX_TOKENS
    assert metric_value(
        handle.metrics(),
        "narwhal_stream_resumes_total",
        outcome="ended",
        reason="closed_before_done",
    )
