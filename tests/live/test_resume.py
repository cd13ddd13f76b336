"""Resumable streams over real loopback HTTP: a consumer scripted to die mid-stream, the same
client stream resumed on another consumer by token replay, and the client's text compared with
an uninterrupted run's (the emulator generates autoregressively, so a continuation that is off by
one token, or re-tokenised, shows up as different text)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from narwhal.emulator.text import completion_tokens, prompt_text, token_ids
from tests.live.conftest import HTTP, Emulator, RouterHandle, metric_value

PROMPT = "A narwhal's tusk is a tooth that grows through its lip"
MESSAGES = [{"role": "user", "content": PROMPT}]
MAX_TOKENS = 12
DIE_AFTER = 5


def uninterrupted(n: int = MAX_TOKENS, chat: bool = False) -> str:
    body = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    return "".join(completion_tokens(prompt_text(body, chat=chat), n))


def stream_bytes(handle: RouterHandle, chat: bool = False, **extra: Any) -> bytes:
    """The body of one streamed completion (``chat``: chat completion), as the client reads
    it; ``extra`` fields set to None are left out."""
    body: dict[str, Any] = {"model": "tiny-llama", "max_tokens": MAX_TOKENS, "stream": True}
    body.update({"messages": MESSAGES} if chat else {"prompt": PROMPT})
    body = {k: v for k, v in {**body, **extra}.items() if v is not None}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with HTTP.stream("POST", handle.url + path, json=body) as reply:
        assert reply.status_code == 200
        return reply.read()


def stream_events(handle: RouterHandle, chat: bool = False, **extra: Any) -> list[Any]:
    """Every SSE data field of one streamed completion, JSON-decoded ("[DONE]" kept as is)."""
    raw = stream_bytes(handle, chat, **extra).decode()
    datas = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in datas]


def until_placed_on_the_dying(
    handle: RouterHandle,
    dying: Emulator,
    chat: bool = False,
    tokens: int = MAX_TOKENS,
    **extra: Any,
) -> tuple[list[Any], dict[str, Any]]:
    """Stream requests until one was placed on the dying consumer (the placement spreads them;
    a bounded number of tries): its events and its request record. ``tokens``: how many an
    uninterrupted run of the request generates."""
    before = len(handle.logged_requests())
    for tries in range(before + 1, before + 11):
        events = stream_events(handle, chat, **extra)
        handle.wait_for(lambda n=tries: len(handle.logged_requests()) == n)  # type: ignore[misc]
        record = handle.logged_requests()[-1]
        if dying.url in record["engines"]:
            return events, record
        assert text_of(events) == uninterrupted(tokens, chat)  # placed on the healthy one
    raise AssertionError("no request was placed on the dying consumer in 10 tries")


def text_of(events: list[Any]) -> str:
    """The text the client assembles: completions' ``text``, chat's ``delta.content``."""
    return "".join(
        c.get("text", "") or (c.get("delta") or {}).get("content") or ""
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices", [])
    )


def fleet(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    *,
    resume: bool = True,
    **recovery: Any,
) -> tuple[Emulator, Emulator, RouterHandle]:
    """A producer, a consumer the tests script to die on every stream and a healthy consumer; the
    breaker never ejects, so requests keep being placed on both."""
    producer = emulator("prefill", seed=1)
    dying, healthy = emulator("decode", seed=2), emulator("decode", seed=3)
    handle = router(
        [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": dying.url, "role": "decode"},
            {"url": healthy.url, "role": "decode"},
        ],
        recovery={
            "eject_after": 1000,
            "probe_interval_s": 60.0,
            "resume_streams": resume,
            **recovery,
        },
    )
    return dying, healthy, handle


FAULTS = [
    pytest.param({"kind": "disconnect"}, "closed_before_done", id="disconnect"),
    pytest.param({"kind": "stall", "seconds": 30}, "silence", id="silence"),
    pytest.param({"kind": "inband_error", "code": 500}, "inband_error", id="inband-error"),
]


@pytest.mark.parametrize(("fault", "kind"), FAULTS)
def test_a_consumer_dying_mid_stream_is_resumed_with_the_uninterrupted_text(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    fault: dict[str, Any],
    kind: str,
) -> None:
    dying, healthy, handle = fleet(emulator, router)
    dying.faults({**fault, "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(
        handle, dying, stream_options={"include_usage": True}
    )
    assert text_of(events) == uninterrupted()
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [e for e in events if isinstance(e, dict)]
    assert not [e for e in chunks if "error" in e]
    assert len({e["id"] for e in chunks}) == 1  # one client stream
    assert len({e["created"] for e in chunks}) == 1
    assert all(c["index"] == 0 for e in chunks for c in e["choices"])
    usage = chunks[-1]["usage"]  # the whole stream's, not the resumed leg's
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] == len(PROMPT) + 1
    # the token ids the router asked for are its own: the client did not ask for them
    assert not [
        c for e in chunks for c in e["choices"] if set(c) & {"token_ids", "prompt_token_ids"}
    ]
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_stream_resumes_total", outcome="resumed", reason=kind)
    assert record["status"] == 200 and record["outcome"] == "ok"
    assert record["resumes"] == 1 and record["attempts"] == 2
    assert record["output_tokens"] == MAX_TOKENS
    # the failed consumer streamed, the resumed leg prefilled afresh and decoded elsewhere
    assert record["engines"][1:] == [dying.url, record["engines"][0], healthy.url]
    # the failure, for a replay of the log (narwhal replay): an attempt failed on the dying one
    failed = [line for line in handle.logged() if line["event"] == "attempt_failed"]
    assert [(f["engine"], f["fault"], f["request"], f["resumed"]) for f in failed] == [
        (dying.url, kind, record["request_id"], True)
    ]


def test_resume_off_keeps_the_terminal_error_event(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    dying, _healthy, handle = fleet(emulator, router, resume=False)
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(handle, dying)
    assert text_of(events) == uninterrupted(DIE_AFTER)
    assert "error" in events[-1] and "[DONE]" not in events
    chunks = [e for e in events if isinstance(e, dict) and "choices" in e]
    assert not any("token_ids" in c for e in chunks for c in e["choices"])  # asked as sent
    assert "narwhal_stream_resumes_total{" not in handle.metrics()
    assert "resumes" not in record and "resume_refused" not in record


@pytest.mark.parametrize(
    ("extra", "recovery", "reason"),
    [
        pytest.param({"stop": ["zz"]}, {}, "stop", id="stop-strings"),
        pytest.param({"logprobs": 1}, {}, "logprobs", id="logprobs"),
        pytest.param({"response_format": {"type": "json_object"}}, {}, "guided", id="guided"),
        pytest.param({}, {"max_resumes": 0}, "max_resumes", id="max-resumes"),
        pytest.param({}, {"resume_max_seq_len": 20}, "sequence_length", id="sequence-length"),
    ],
)
def test_a_stream_that_cannot_be_replayed_exactly_ends_with_the_terminal_event(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    extra: dict[str, Any],
    recovery: dict[str, Any],
    reason: str,
) -> None:
    dying, _healthy, handle = fleet(emulator, router, **recovery)
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(handle, dying, **extra)
    assert "error" in events[-1] and "[DONE]" not in events
    assert text_of(events) == uninterrupted(DIE_AFTER)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_stream_resumes_total", outcome="refused", reason=reason)
    assert record["resume_refused"] == reason and record["attempts"] == 1


def uninterrupted_ids(n: int = MAX_TOKENS) -> list[int]:
    tokens = completion_tokens(prompt_text({"prompt": PROMPT}, chat=False), n)
    return [i for token in tokens for i in token_ids(token, bos=False)]


def test_a_client_that_asked_for_token_ids_gets_them_continuous_across_the_resume(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    dying, _healthy, handle = fleet(emulator, router)
    dying.faults({"kind": "disconnect", "after_tokens": DIE_AFTER})
    events, record = until_placed_on_the_dying(handle, dying, return_token_ids=True)
    assert record["resumes"] == 1 and text_of(events) == uninterrupted()
    choices = [c for e in events if isinstance(e, dict) for c in e["choices"]]
    assert [i for c in choices for i in c.get("token_ids") or []] == uninterrupted_ids()
    prompts = [c["prompt_token_ids"] for c in choices if "prompt_token_ids" in c]
    assert prompts == [token_ids(prompt_text({"prompt": PROMPT}, chat=False))]  # once, the first


def same_but_ids(raw: bytes) -> bytes:
    """A stream's bytes with its response id and creation time blanked (each run draws its
    own)."""
    raw = re.sub(rb'"id":"[^"]*"', b'"id":""', raw)
    return re.sub(rb'"created":[0-9]+', b'"created":0', raw)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="plain"),
        pytest.param({"stream_options": {"include_usage": True}}, id="usage"),
        pytest.param({"return_token_ids": True}, id="client-asked-ids"),
    ],
)
def test_an_unfailed_stream_reaches_the_client_byte_for_byte_as_with_resuming_off(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    extra: dict[str, Any],
) -> None:
    def pair(resume: bool) -> RouterHandle:  # fresh engines: the same prefix caches' state
        producer, consumer = emulator("prefill", seed=1), emulator("decode", seed=2)
        engines = [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": consumer.url, "role": "decode"},
        ]
        return router(engines, recovery={"resume_streams": resume})

    with_resume, without = stream_bytes(pair(True), **extra), stream_bytes(pair(False), **extra)
    assert same_but_ids(with_resume) == same_but_ids(without)
    assert with_resume.endswith(b"data: [DONE]\n\n")
    assert (b'"token_ids"' in with_resume) is ("return_token_ids" in extra)


@pytest.mark.parametrize("usage", [True, False], ids=["usage", "no-usage"])
def test_when_only_the_end_was_lost_the_router_ends_the_stream_with_the_usage_asked(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], usage: bool
) -> None:
    dying, _healthy, handle = fleet(emulator, router)
    dying.faults({"kind": "disconnect", "after_tokens": MAX_TOKENS})  # every token, no end
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    events, record = until_placed_on_the_dying(handle, dying, **extra)
    assert text_of(events) == uninterrupted()
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert record["status"] == 200 and record["attempts"] == 1  # nothing sent afresh
    chunks = [e for e in events if isinstance(e, dict)]
    usages = [e for e in chunks if e.get("usage")]
    if not usage:
        assert not usages
        return
    assert len(usages) == 1 and usages[0] is chunks[-1] and usages[0]["choices"] == []
    assert usages[0]["usage"] == {
        "prompt_tokens": len(PROMPT) + 1,
        "total_tokens": len(PROMPT) + 1 + MAX_TOKENS,
        "completion_tokens": MAX_TOKENS,
    }
    assert {(e["id"], e["created"], e["model"]) for e in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], "tiny-llama")
    }
