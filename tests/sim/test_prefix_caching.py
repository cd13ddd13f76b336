"""vLLM's automatic prefix caching in the simulated engine: a cached prefix is not computed
again, a consumer pulls only the KV it lacks, hits are reported in ``cached_tokens`` and the
prefix-cache counters, and a run's ``prefix_cache_hit_rate`` says what the workload shared."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import simpy

from narwhal.core.ports import Burst, Chunk, Reply, StreamEnd, StreamOpened
from narwhal.core.sse import SseParser
from narwhal.sim.driver import SimTransport, start
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.handoffs import Registry
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.prefix import prompt_text
from narwhal.sim.gpu.wire import BOS_ID, GENERATED_ID, ids_text
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.results import summarize
from narwhal.sim.runner import run
from narwhal.sim.timing import LinearStepTiming

from .conftest import scenario

A, D, KV = 1e-4, 1e-3, 1e-5  # linear timing: s per prefilled token, per decode step, per pulled
TIMING = LinearStepTiming(prefill_s_per_token=A, decode_s_per_token=D, kv_s_per_token=KV)
PRODUCER, CONSUMER = "http://sim-p0", "http://sim-d0"
PROMPT = prompt_text(300, ((1, 200), (2, 100)), 0)  # 300 tokens with a content identity
CACHED = 288  # (300 - 1) // 16 full blocks: the last token is always computed


class Fleet:
    """A producer and a consumer on one KV network, and the router's side of their calls."""

    def __init__(self, **params: Any) -> None:
        self.env = simpy.Environment()
        net = KvNetwork(self.env, bandwidth_gbps=TIMING.link_bandwidth_gbps(), setup_s=0.0)
        registry: Registry = {}
        settings = EngineParams(model="llama3-8b", jitter=0.0, step_overhead_s=0.0, **params)
        self.engines = {
            url: SimEngine(self.env, url, i, settings, TIMING, net, registry, random.Random(i))
            for i, url in enumerate((PRODUCER, CONSUMER))
        }
        self.transport = SimTransport(self.env, self.engines)

    def prefill(self, prompt: str | list[int] = PROMPT) -> tuple[dict[str, Any], float]:
        """A prefill leg on the producer: its reply and how long it took."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 1, "stream": False}
        body["kv_transfer_params"] = {"do_remote_decode": True}
        out: dict[str, Any] = {}

        async def call() -> None:
            began = self.env.now
            reply = await self.transport.call(PRODUCER, "POST", "/v1/completions", body, {}, 99.0)
            assert isinstance(reply, Reply) and reply.status == 200
            out.update(payload=json.loads(reply.body), took=self.env.now - began)

        start(self.env, call())
        self.env.run(until=self.env.now + 5.0)
        return out["payload"], out["took"]

    def decode(self, params: dict[str, Any], prompt: str = PROMPT) -> float:
        """A streamed decode leg on the consumer with the producer's descriptor: the time to
        its first byte of output (the pull, then the first token)."""
        body = {"prompt": prompt, "max_tokens": 2, "stream": True, "kv_transfer_params": params}
        out: dict[str, float] = {}

        async def read() -> None:
            began = self.env.now
            opened = await self.transport.open_stream(CONSUMER, "/v1/completions", body, {}, 99.0)
            assert isinstance(opened, StreamOpened)
            first = await self.transport.next_chunk(opened.handle, self.env.now + 99)
            out["first"] = self.env.now - began
            while not isinstance(first, StreamEnd):
                first = await self.transport.next_chunk(opened.handle, self.env.now + 99)

        start(self.env, read())
        self.env.run(until=self.env.now + 5.0)
        return out["first"]


def test_a_cached_prefix_is_not_prefilled_again_and_is_reported() -> None:
    fleet = Fleet()
    first, cold = fleet.prefill()
    second, warm = fleet.prefill()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert second["kv_transfer_params"]["remote_prefill_cached_tokens"] == CACHED
    assert cold == pytest.approx(D + A * 300)  # one step: the prompt, and the sampled token
    assert warm == pytest.approx(D + A * (300 - CACHED))
    # the handed-off blocks start with the cached ones (the first prefill's, still held)
    assert (
        second["kv_transfer_params"]["remote_block_ids"][0][:18]
        == (first["kv_transfer_params"]["remote_block_ids"][0][:18])
    )
    totals = fleet.engines[PRODUCER].totals
    assert (totals.prefix_cache_queries, totals.prefix_cache_hits) == (600, CACHED)


def test_prompts_share_blocks_exactly_as_far_as_their_segments_agree() -> None:
    fleet = Fleet()
    fleet.prefill(prompt_text(300, ((1, 200), (2, 100)), 0))
    other = prompt_text(300, ((1, 200), (3, 100)), 1)  # the same first 200 tokens
    payload, took = fleet.prefill(other)
    assert payload["usage"]["prompt_tokens_details"] == {"cached_tokens": 192}  # 12 blocks
    assert took == pytest.approx(D + A * (300 - 192))
    unique, _ = fleet.prefill(prompt_text(300, (), 2))  # no identity: never a hit
    assert unique["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_a_consumer_pulls_only_the_kv_its_own_cache_lacks() -> None:
    fleet = Fleet()
    first, _ = fleet.prefill()
    cold = fleet.decode(first["kv_transfer_params"])
    assert cold == pytest.approx(KV * 300 + D)  # the whole prompt's KV, then a token
    second, _ = fleet.prefill()
    warm = fleet.decode(second["kv_transfer_params"])
    assert warm == pytest.approx(KV * (300 - CACHED) + D)  # the blocks it held are not pulled
    consumer = fleet.engines[CONSUMER].totals
    assert (consumer.prefix_cache_queries, consumer.prefix_cache_hits) == (600, CACHED)
    assert not fleet.engines[PRODUCER].handoffs.leases  # both handoffs were taken


def stream_ids(fleet: Fleet, params: dict[str, Any], tokens: int) -> tuple[list[int], list[int]]:
    """A decode leg asked for ``return_token_ids``: the prompt's ids and the generated ids it
    reported."""
    body = {"prompt": PROMPT, "max_tokens": tokens, "stream": True, "return_token_ids": True}
    body["kv_transfer_params"] = params
    raw: list[bytes] = []

    async def read() -> None:
        opened = await fleet.transport.open_stream(CONSUMER, "/v1/completions", body, {}, 99.0)
        assert isinstance(opened, StreamOpened)
        while True:
            chunk = await fleet.transport.next_chunk(opened.handle, fleet.env.now + 99)
            if isinstance(chunk, Chunk):
                raw.append(chunk.data)
            elif isinstance(chunk, Burst):
                raw.extend(chunk.chunks)
            else:
                assert isinstance(chunk, StreamEnd)
                return

    start(fleet.env, read())
    fleet.env.run(until=fleet.env.now + 5.0)
    prompt: list[int] = []
    generated: list[int] = []
    for event in SseParser().feed(b"".join(raw)):
        for choice in (event.payload or {}).get("choices", []):
            prompt += choice.get("prompt_token_ids") or []
            generated += choice.get("token_ids") or []
    return prompt, generated


def test_a_resumed_legs_token_id_prompt_hits_the_original_prompts_blocks() -> None:
    fleet = Fleet()
    first, _ = fleet.prefill()
    prompt, generated = stream_ids(fleet, first["kv_transfer_params"], 5)
    # the prompt's ids spell its text (its content identity comes back with them)
    assert len(prompt) == 300 and prompt[0] == BOS_ID and ids_text(prompt) == (PROMPT, 1)
    assert generated == [GENERATED_ID] * 5
    # the resumed leg's prompt: the prompt's ids, then the delivered ones
    resumed, took = fleet.prefill([*prompt, *generated])
    assert resumed["usage"]["prompt_tokens"] == 305
    assert resumed["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert took == pytest.approx(D + A * (305 - CACHED))
    # the generated tokens' blocks are the request's own: a prompt of them shares nothing
    alone, _ = fleet.prefill([BOS_ID, *[GENERATED_ID] * 40])
    assert alone["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_with_prefix_caching_off_nothing_is_cached_or_reported() -> None:
    fleet = Fleet(prefix_caching=False)
    fleet.prefill()
    payload, took = fleet.prefill()
    assert "prompt_tokens_details" not in payload["usage"]
    assert payload["kv_transfer_params"]["remote_prefill_cached_tokens"] == 0
    assert took == pytest.approx(D + A * 300)
    totals = fleet.engines[PRODUCER].totals
    assert (totals.prefix_cache_queries, totals.prefix_cache_hits) == (0, 0)


def test_a_crash_loses_the_prefix_cache() -> None:
    fleet = Fleet()
    fleet.prefill()
    producer = fleet.engines[PRODUCER]
    producer.crash()
    producer.restart()
    payload, took = fleet.prefill()
    assert payload["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert took == pytest.approx(D + A * 300)


SHARED = {
    "kind": "shared_context",
    "prompt": None,
    "output": None,
    "duration_s": None,
    "shared_context": {
        "groups": 4,
        "users_per_group": 3,
        "system_prompt_tokens": 1000,
        "question_tokens": 100,
        "output_tokens": 8,
        "stages": [{"rate": 10.0, "duration_s": 4.0}],
    },
}


def test_a_shared_context_run_reports_its_hit_rate_and_none_with_caching_off() -> None:
    on = summarize(run(scenario(workload=SHARED)))
    off = summarize(run(scenario(workload=SHARED, fleet={"prefix_caching": False})))
    assert on["requests"] == off["requests"] > 20 and on["succeeded"] == on["requests"]
    # 12 distinct prompts of 1,100 tokens on 2 producers and 2 consumers: most tokens are hits
    assert 0.5 < on["prefix_cache_hit_rate"] < 1.0
    assert off["prefix_cache_hit_rate"] == 0.0
    assert on["ttft_s"]["p50"] < off["ttft_s"]["p50"]  # cached prefills are faster


def test_prompts_without_identity_never_hit() -> None:
    summary = summarize(run(scenario(workload={"duration_s": 3.0})))  # fixed lengths only
    assert summary["succeeded"] == summary["requests"] > 0
    assert summary["prefix_cache_hit_rate"] == 0.0
