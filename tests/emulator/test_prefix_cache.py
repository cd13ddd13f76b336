"""The emulator's prefix cache: chained block hashes in a bounded LRU, and over loopback HTTP
cached tokens skip prefill time, a consumer pulls only what it lacks, and both report them in
``usage.prompt_tokens_details.cached_tokens`` and vLLM's prefix-cache counters."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from narwhal.cli import main
from narwhal.core.sse import SseParser
from narwhal.emulator.prefix_cache import PrefixCache, block_hashes
from narwhal.emulator.timing import LinearTiming
from tests.live.conftest import HTTP, Emulator, metric_value

PROMPT = "k" * 799  # 800 tokens with BOS: 50 blocks of 16
CACHED = 784  # 49 blocks: the block holding the last token is computed


def test_blocks_are_hashed_as_a_chain_and_matched_up_to_the_first_difference() -> None:
    shared = "a" * 40
    one, two = block_hashes(shared + "b" * 24, 16), block_hashes(shared + "c" * 24, 16)
    assert len(one) == len(two) == 4  # 65 tokens: 4 full blocks
    assert one[:2] == two[:2] and one[2:] != two[2:]  # block 2 holds tokens 32-47: differs
    assert block_hashes("x" * 31, 16)[1] != block_hashes("y" + "x" * 30, 16)[1]  # chained
    cache = PrefixCache(block_size=16, capacity=100)
    assert cache.lookup(shared + "b" * 24, 65) == 0
    cache.insert(shared + "b" * 24)
    assert cache.lookup(shared + "c" * 24, 65) == 32
    assert cache.lookup(shared + "b" * 24, 65) == 64  # 65 tokens: all four full blocks
    assert cache.lookup(shared + "b" * 23, 64) == 48  # 64 tokens: short of the last one
    assert (cache.queries, cache.hits) == (65 + 65 + 64 + 65, 32 + 64 + 48)


def test_the_cache_is_bounded_and_evicts_a_chain_from_its_end() -> None:
    cache = PrefixCache(block_size=16, capacity=3)
    cache.insert("a" * 63)  # 4 blocks: the last is evicted at once
    assert len(cache) == 3 and cache.lookup("a" * 63 + "z", 65) == 48
    cache.insert("b" * 31)  # 2 more blocks, most recently used: the old chain's tail goes
    assert cache.lookup("a" * 63 + "z", 65) == 16 and cache.lookup("b" * 31 + "z", 33) == 32
    off = PrefixCache(block_size=16, capacity=3, enabled=False)
    off.insert("a" * 63)
    assert off.lookup("a" * 63, 64) == 0 and len(off) == 0 and off.queries == 0


def whole(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    began = time.monotonic()
    reply = HTTP.post(url + "/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json(), time.monotonic() - began


def test_a_cached_prompt_skips_its_prefill_time_and_reports_it(
    emulator: Callable[..., Emulator],
) -> None:
    engine = emulator("both", timing=LinearTiming(prefill_s_per_token=0.0005))  # 0.4 s cold
    body = {"prompt": PROMPT, "max_tokens": 1}
    cold, cold_s = whole(engine.url, body)
    warm, warm_s = whole(engine.url, body)
    assert cold["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert warm["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert cold_s >= 0.4  # 800 tokens at 0.5 ms
    assert warm_s < 0.4 - 0.5 * 0.0005 * CACHED  # at most 16 tokens computed: 8 ms, and HTTP
    text = HTTP.get(engine.url + "/metrics").text
    assert metric_value(text, "vllm:prefix_cache_queries_total") == 1600.0
    assert metric_value(text, "vllm:prefix_cache_hits_total") == float(CACHED)
    reply = HTTP.post(
        engine.url + "/v1/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    usage = [
        e.payload for e in SseParser().feed(reply.content) if e.payload and "usage" in e.payload
    ]
    assert usage[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}


def test_a_consumer_pulls_only_what_its_cache_lacks_and_reports_the_producers_hit(
    emulator: Callable[..., Emulator],
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    body = {"prompt": PROMPT, "max_tokens": 2}

    def handoff() -> dict[str, Any]:
        reply, _ = whole(producer.url, {**body, "kv_transfer_params": {"do_remote_decode": True}})
        params: dict[str, Any] = reply["kv_transfer_params"]
        return params

    def decode(params: dict[str, Any]) -> dict[str, Any]:
        reply, _ = whole(consumer.url, {**body, "kv_transfer_params": params})
        return reply

    first = handoff()
    assert first["remote_prefill_cached_tokens"] == 0
    assert decode(first)["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    second = handoff()
    assert second["remote_prefill_cached_tokens"] == CACHED
    assert decode(second)["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    counts = consumer.app.engine.counts
    assert counts["pulls_ok"] == 2 and counts["external_kv_tokens"] == 800 + (800 - CACHED)
    assert consumer.app.engine.prefix_cache.hits == CACHED


def test_without_prefix_caching_nothing_is_cached_or_reported(
    emulator: Callable[..., Emulator],
) -> None:
    engine = emulator("both", prefix_caching=False)
    body = {"prompt": PROMPT, "max_tokens": 1}
    whole(engine.url, body)
    reply, _ = whole(engine.url, body)
    assert "prompt_tokens_details" not in reply["usage"]
    text = httpx.get(engine.url + "/metrics").text
    assert metric_value(text, "vllm:prefix_cache_queries_total") == 0.0


def test_a_prefix_cache_without_room_is_refused_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["emulate", "--port", "0", "--prefix-cache-blocks", "0"]) == 2
    assert "--prefix-cache-blocks must be at least 1, got 0" in capsys.readouterr().err
