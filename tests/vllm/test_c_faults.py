"""Faults with the real engines, through Narwhal, as a client (the OpenAI SDK) sees them.

Ordered from harmless to destructive: a frozen consumer (SIGSTOP/SIGCONT), a frozen producer
(handoff too old), a stopped producer (restarted afterwards), and last a consumer killed
mid-stream (left dead: the session ends, or the ``pair`` fixture restarts it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import openai
import pytest

from narwhal.vllm.processes import EngineProcess, metric_sum
from tests.vllm.conftest import TIMINGS, Fleet
from tests.vllm.harness import MODEL, Narwhal
from tests.vllm.test_a_serving import SOURCE, unique_prompt

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

REQUESTS = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"
PROBES = "narwhal_probes_total"  # the router's, by engine and outcome


def consumer_load(pair: Fleet) -> float:
    """Work the consumer has done: prompt tokens from any source plus finished requests."""
    text = pair.consumer.metrics()
    return metric_sum(text, SOURCE) + metric_sum(text, REQUESTS)


def settled_load(pair: Fleet, at_least: float, timeout: float) -> float:
    """:func:`consumer_load` once it reaches ``at_least`` (a finished request may reach the
    consumer's metrics a moment after its reply), or as it stands after ``timeout``."""
    end = time.monotonic() + timeout
    while (load := consumer_load(pair)) < at_least and time.monotonic() < end:
        time.sleep(0.1)
    return load


def error_type(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return str(inner.get("type"))
    return ""


def wait_for_failed_probes(router: Narwhal, url: str, count: int, timeout: float) -> None:
    """Poll the router until ``count`` probes of ``url`` have failed, ``url`` out of service
    (ejected or being probed) at every look."""
    end = time.monotonic() + timeout
    while True:
        failed = metric_sum(router.metrics(), PROBES, engine=url, outcome="failed")
        state = router.engine(url)["state"]
        assert state in ("ejected", "probing"), state
        if failed >= count:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{failed} of {count} probes of {url} failed in {timeout} s")
        time.sleep(0.2)


def test_frozen_consumer_504_then_probe_readmits(
    narwhal: Callable[..., Narwhal], pair: Fleet
) -> None:
    timeout_s = 3.0
    router = narwhal(
        engine={"first_token_timeout_s": timeout_s},
        recovery={"eject_after": 1, "probe_interval_s": 0.5},
    )
    client = router.client()
    pair.consumer.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(
                model=MODEL, prompt=unique_prompt(1, 50), max_tokens=8, temperature=0, stream=True
            )
        took = time.monotonic() - started
        assert caught.value.status_code == 504, caught.value
        assert error_type(caught.value) == "engine_timeout"
        assert timeout_s <= took < timeout_s + 5, took
        entry = router.engine(pair.consumer.url)
        assert entry["state"] in ("ejected", "probing"), entry
        assert entry["ejected_since"] is not None
        # Probes keep failing while it is frozen: two of them fail, and it stays out meanwhile.
        wait_for_failed_probes(router, pair.consumer.url, 2, timeout=45)
    finally:
        pair.consumer.thaw()
    router.wait_engine(pair.consumer.url, "ready", timeout=45)
    done = client.completions.create(
        model=MODEL, prompt=unique_prompt(2, 50), max_tokens=8, temperature=0
    )
    assert len(done.choices[0].text) == 8


def test_handoff_older_than_max_age_is_not_used(
    narwhal: Callable[..., Narwhal], pair: Fleet
) -> None:
    max_age_s = 1.5
    router = narwhal(engine={"max_handoff_age_s": max_age_s})
    client = router.client()
    load_before = consumer_load(pair)
    pair.producer.freeze()  # the prefill leg cannot finish within max_handoff_age_s
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(
                model=MODEL, prompt=unique_prompt(3, 50), max_tokens=8, temperature=0
            )
        took = time.monotonic() - started
    finally:
        pair.producer.thaw()
    assert caught.value.status_code == 504, caught.value
    assert error_type(caught.value) == "handoff_too_old"
    assert max_age_s <= took < max_age_s + 5, took
    assert consumer_load(pair) == load_before
    assert router.engine(pair.producer.url)["failure_streak"] == 1
    # The same router and fleet serve a fresh handoff. Its prefill runs after the thawed
    # producer has finished (or dropped) the stale one, which came first, so by its end nothing
    # may have decoded the stale handoff: the consumer did this request's work and no more
    # (its prompt's tokens, every one pulled, and one finished request).
    done = client.completions.create(
        model=MODEL, prompt=unique_prompt(4, 50), max_tokens=8, temperature=0
    )
    assert len(done.choices[0].text) == 8
    assert done.usage is not None
    expected = load_before + done.usage.prompt_tokens + 1
    assert settled_load(pair, expected, timeout=10) == expected


def test_producer_down_gives_502_before_commit(
    narwhal: Callable[..., Narwhal], pair: Fleet
) -> None:
    # Health checks every 60 s: the request, not a health check, is what finds the producer down
    # (a health check first would mark it down and the answer would be 503 + Retry-After).
    router = narwhal(recovery={"probe_interval_s": 60.0})
    client = router.client()
    load_before = consumer_load(pair)
    pair.producer.kill()
    try:
        chunks: list[object] = []
        with pytest.raises(openai.APIStatusError) as caught:
            chunks.extend(
                client.completions.create(
                    model=MODEL, prompt=unique_prompt(5, 50), max_tokens=8, stream=True
                )
            )
        assert caught.value.status_code == 502, caught.value
        assert error_type(caught.value) == "engine_unreachable"
        assert chunks == []  # an ordinary HTTP error: nothing was streamed
        assert router.engine(pair.producer.url)["failure_streak"] == 1
        assert consumer_load(pair) == load_before
    finally:
        TIMINGS["restart producer (alone)"] = pair.producer.start().wait_healthy()
        pair.pair_ready()


def kill_after_tokens(engine: EngineProcess, tokens: int, timeout: float) -> threading.Thread:
    """Kill ``engine`` once it has generated ``tokens`` more tokens (its own metric): the kill
    lands mid-stream whatever pace the client reads at."""
    before = engine.metric(GENERATED)

    def watch() -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if engine.metric(GENERATED) >= before + tokens:
                engine.kill()
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_consumer_killed_mid_stream_ends_with_an_error_event(
    narwhal: Callable[..., Narwhal], pair: Fleet
) -> None:
    # Only the stream may judge the consumer here: no health check in the test's lifetime.
    router = narwhal(recovery={"eject_after": 2, "probe_interval_s": 60.0})
    client = router.client()
    max_tokens = 1900  # about 4 s of decode: the kill comes long before the end
    killer = kill_after_tokens(pair.consumer, 20, timeout=30)
    stream = client.completions.create(
        model=MODEL, prompt=unique_prompt(6, 50), max_tokens=max_tokens, temperature=0, stream=True
    )
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk.choices[0].text if chunk.choices else "")
    killer.join(timeout=30)
    assert not pair.consumer.alive()
    assert not isinstance(caught.value, openai.APIStatusError)  # committed: an SSE error event
    assert "closed the stream before [DONE]" in caught.value.message
    assert 1 <= len("".join(received)) < max_tokens
    entry = router.engine(pair.consumer.url)
    assert entry["failure_streak"] == 1, entry
    assert entry["state"] == "ready", entry  # counted, not yet ejected (eject_after = 2)
