"""The core's fault x phase matrix, repeated over real loopback HTTP with the openai SDK.

Router and engines are real servers (uvicorn on 127.0.0.1); the faults are scripted on the
emulated engines. Before commit a fault is an HTTP error (``openai.APIStatusError`` with the
mapped status); after commit it is the one terminal error event (``openai.APIError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from narwhal.core.errors import DONE_BEFORE_TOKEN_TEXT, SILENCE_TEXT
from narwhal.emulator.text import completion_tokens, prompt_text
from tests.live.conftest import (
    HTTP,
    Emulator,
    RouterHandle,
    Servers,
    metric_value,
    start_emulator,
    start_router,
)

PROMPT = "The narwhal is a medium-sized toothed whale"
MAX_TOKENS = 6


def expected(prompt: str = PROMPT, n: int = MAX_TOKENS) -> list[str]:
    return completion_tokens(prompt_text({"prompt": prompt}, chat=False), n)


@pytest.fixture(scope="module")
def shared_fleet(module_servers: Servers) -> tuple[Emulator, Emulator, RouterHandle]:
    producer = start_emulator(module_servers, "prefill", seed=1)
    consumer = start_emulator(module_servers, "decode", seed=2)
    handle = start_router(
        module_servers,
        [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": consumer.url, "role": "decode"},
        ],
        recovery={"eject_after": 1000, "probe_interval_s": 60.0},  # health checks: at start only
    )
    return producer, consumer, handle


@pytest.fixture
def fleet(
    shared_fleet: tuple[Emulator, Emulator, RouterHandle],
) -> Iterator[tuple[Emulator, Emulator, RouterHandle]]:
    """The shared fleet, with no faults at the start and nothing in flight at the end."""
    producer, consumer, handle = shared_fleet
    producer.clear()
    consumer.clear()
    yield shared_fleet
    producer.clear()
    consumer.clear()
    handle.wait_for(lambda: handle.status()["requests_in_flight"] == 0)
    handle.wait_for(lambda: consumer.state()["running"] == 0 == producer.state()["running"])


def stream_tokens(client: openai.OpenAI, **extra: Any) -> list[str]:
    stream = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True, **extra
    )
    return [choice.text for chunk in stream for choice in chunk.choices if choice.text]


def test_stream_carries_exactly_the_engine_tokens(fleet: Any) -> None:
    producer, consumer, handle = fleet
    assert stream_tokens(handle.client()) == expected()
    pulled = consumer.state()["pulls_ok"]

    def moved() -> float:  # prompt tokens pulled, and those its prefix cache held instead
        text = HTTP.get(consumer.url + "/metrics").text
        return metric_value(
            text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
        ) + metric_value(text, "vllm:prefix_cache_hits_total")

    before = moved()
    assert stream_tokens(handle.client()) == expected()
    assert consumer.state()["pulls_ok"] == pulled + 1  # the consumer really pulled the KV
    assert producer.state()["kv_held"] == 0
    assert moved() - before == len(PROMPT) + 1  # (only what its prefix cache lacked was pulled)


def test_non_streaming_and_chat(fleet: Any) -> None:
    _, _, handle = fleet
    client = handle.client()
    whole = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert whole.choices[0].text == "".join(expected())
    assert whole.usage is not None and whole.usage.completion_tokens == MAX_TOKENS
    messages = [{"role": "user", "content": "hello"}]
    chat_tokens = completion_tokens(prompt_text({"messages": messages}, chat=True), 4)
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=messages,
            max_tokens=4,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"  # the role chunk is forwarded
    text = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert text == chat_tokens
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    reply = client.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        max_tokens=4,  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content == "".join(chat_tokens)


# (where, fault, expected status, message fragment) — every fault before the first token.
BEFORE_COMMIT = [
    ("consumer", {"kind": "http_5xx", "code": 503}, 502, "answered HTTP 503"),
    ("consumer", {"kind": "reset"}, 502, "reset"),
    ("consumer", {"kind": "hang_headers"}, 504, "first_token_timeout_s"),
    ("consumer", {"kind": "hang_first_token"}, 504, "first_token_timeout_s"),
    ("consumer", {"kind": "early_done"}, 502, DONE_BEFORE_TOKEN_TEXT),
    ("consumer", {"kind": "disconnect", "after_tokens": 0}, 502, "before [DONE]"),
    ("consumer", {"kind": "inband_error", "after_tokens": 0, "code": 503}, 503, "in stream"),
    ("consumer", {"kind": "inband_error", "after_tokens": 0, "code": 429}, 429, "in stream"),
    ("consumer", {"kind": "kv_transfer_fail"}, 500, "Internal server error"),
    ("producer", {"kind": "http_5xx", "code": 500}, 502, "answered HTTP 500"),
    ("producer", {"kind": "reset"}, 502, "reset"),
    ("producer", {"kind": "hang_headers"}, 504, "max_handoff_age_s"),
    ("producer", {"kind": "bad_descriptor"}, 502, "malformed_block_ids"),
    ("producer", {"kind": "release_handoff"}, 500, "Internal server error"),
]


@pytest.mark.parametrize(
    ("where", "spec", "status", "text"),
    BEFORE_COMMIT,
    ids=[f"{w}-{s['kind']}-{s.get('code', '')}" for w, s, _, _ in BEFORE_COMMIT],
)
@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "whole"])
def test_fault_before_commit_is_an_http_error(
    fleet: Any, where: str, spec: dict[str, Any], status: int, text: str, streaming: bool
) -> None:
    producer, consumer, handle = fleet
    (producer if where == "producer" else consumer).faults(spec)
    client = handle.client()
    with pytest.raises(openai.APIStatusError) as caught:
        if streaming:
            stream_tokens(client)
        else:
            client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert caught.value.status_code == status
    assert text in str(caught.value)
    handle.wait_for(lambda: handle.status()["requests_in_flight"] == 0)
    for engine in handle.status()["engines"]:
        assert engine["reservations"] == {"prefill": 0, "decode": 0}


def answered_a_request(engine: Emulator) -> bool:
    """The engine's server has sent a whole response (uvicorn counts a request at its end)."""
    return engine.server.server.server_state.total_requests > 0


def test_refused_producer_is_502(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer = emulator("prefill")
    consumer = emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        recovery={"probe_interval_s": 60.0},
    )
    # The router health-checks every engine once at start (then every 60 s). Stopping the
    # producer before it has answered would fail that check and eject it: a 503, not the 502.
    handle.wait_for(lambda: answered_a_request(producer))
    producer.server.stop()
    with pytest.raises(openai.APIStatusError) as caught:
        stream_tokens(handle.client())
    assert caught.value.status_code == 502
    assert "refused" in str(caught.value)


def test_refuse_fault_stops_listening(fleet: Any) -> None:
    _, consumer, handle = fleet
    consumer.faults({"kind": "refused"})
    with pytest.raises(openai.APIStatusError) as caught:
        stream_tokens(handle.client())
    assert caught.value.status_code == 502 and "refused" in str(caught.value)
    consumer.clear()  # through the side channel, which still listens
    assert stream_tokens(handle.client()) == expected()


def test_engine_4xx_is_passed_through(fleet: Any) -> None:
    _, _, handle = fleet
    with pytest.raises(openai.NotFoundError) as caught:
        handle.client().completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    assert "The model `nope` does not exist." in str(caught.value)


# Faults after the first token: the stream was committed, so the SDK raises from the event.
AFTER_COMMIT = [
    ({"kind": "stall", "after_tokens": 2}, SILENCE_TEXT),
    ({"kind": "disconnect", "after_tokens": 2}, "before [DONE]"),
    ({"kind": "inband_error", "after_tokens": 2, "code": 500}, "in-stream engine error"),
]


@pytest.mark.parametrize(("spec", "text"), AFTER_COMMIT, ids=[s["kind"] for s, _ in AFTER_COMMIT])
def test_fault_after_commit_ends_with_the_terminal_event(
    fleet: Any, spec: dict[str, Any], text: str
) -> None:
    _, consumer, handle = fleet
    consumer.faults(spec)
    received: list[str] = []
    stream = handle.client().completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True
    )
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.extend(c.text for c in chunk.choices if c.text)
    assert not isinstance(caught.value, openai.APIStatusError)
    assert text in caught.value.message
    assert received == expected()[:2]


def test_slow_tokens_are_silence_after_commit(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer = emulator("prefill")
    consumer = emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        engine={"first_token_timeout_s": 2.0, "decode_read_timeout_s": 0.3},
    )
    consumer.faults({"kind": "slow", "delay": 0.6})
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in handle.client().completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True
        ):
            received.extend(c.text for c in chunk.choices if c.text)
    assert SILENCE_TEXT in caught.value.message
    assert received == expected()[:1]


def test_a_freeze_stops_streams_already_running(
    fleet: tuple[Emulator, Emulator, RouterHandle],
) -> None:
    """``freeze`` is SIGSTOP: a stream that was flowing goes silent too (504 silence event)."""
    import threading

    _, consumer, handle = fleet
    consumer.faults({"kind": "slow", "delay": 0.05})  # slow enough to freeze it mid-stream
    received: list[str] = []
    failure: list[BaseException] = []

    def read() -> None:
        stream = handle.client().completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=40, stream=True
        )
        try:
            for chunk in stream:
                received.extend(c.text for c in chunk.choices)
        except openai.APIError as error:
            failure.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    end = time.monotonic() + 5
    while not received and time.monotonic() < end:
        time.sleep(0.01)
    consumer.faults({"kind": "freeze"}, replace=False)
    reader.join(10)
    consumer.clear()  # thaws it (through the side channel, which a freeze leaves up)
    assert failure and SILENCE_TEXT in str(failure[0]), failure
    assert 0 < len(received) < 40


def test_a_counted_kv_transfer_fail_waits_for_a_request_that_pulls(fleet: Any) -> None:
    """A plain request (nothing to pull) does not use up a ``kv_transfer_fail`` with a count."""
    _, consumer, handle = fleet
    consumer.faults({"kind": "kv_transfer_fail", "count": 1})
    plain = HTTP.post(consumer.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert plain.status_code == 200
    with pytest.raises(openai.APIStatusError) as caught:  # the first handoff fails its pull
        handle.client().completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=3)
    assert caught.value.status_code == 500
    done = handle.client().completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=3)
    assert done.choices[0].text == "".join(expected(n=3))  # the count was used by that one
