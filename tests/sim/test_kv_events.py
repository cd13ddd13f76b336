"""KV cache events in the simulator: the shared block pool publishes what it caches and evicts,
and kv_aware, fed by the simulated engines' events, places a shared-prefix workload on the
engines that hold the prefixes (real SimPy, seeded)."""

from __future__ import annotations

from typing import Any

from narwhal.core.routing.kv_events import BlockRemoved, BlockStored, KvEvent
from narwhal.engines.block_pool import BlockPool
from narwhal.sim.results import summarize
from narwhal.sim.runner import run

from .conftest import scenario


def test_the_block_pool_publishes_what_it_caches_and_evicts() -> None:
    pool = BlockPool(3, block_size=16)
    events: list[KvEvent] = []
    pool.publish = events.append
    blocks = pool.take(2)
    pool.register([11, 12], blocks)
    pool.register([11], [pool.take(1)[0]])  # already cached elsewhere: nothing published
    assert events == [BlockStored((11, 12), None, (), 16)]
    pool.free(blocks)  # cached blocks become evictable, last block first
    pool.take(3)  # the free stack, then both cached blocks evicted (12 first)
    assert events[1:] == [BlockRemoved((12, 11))]


# several groups sharing long system prompts, more of them than one engine's cache holds
SHARED: dict[str, Any] = {
    "kind": "shared_context",
    "prompt": None,
    "output": None,
    "duration_s": None,
    "shared_context": {
        "groups": 8,
        "users_per_group": 3,
        "system_prompt_tokens": 1024,
        "question_tokens": 32,
        "output_tokens": 8,
        "stages": [{"rate": 30.0, "duration_s": 6.0}],
    },
}


def hit_rate(policy: str, **sim: Any) -> float:
    result = run(
        scenario(
            routing={"prefill": policy, "decode": policy},
            fleet={"prefill": 4, "decode": 2, "prefix_caching": True, "kv_cache_tokens": 6400},
            workload=SHARED,
            sim={"seed": 5, **sim},
        )
    )
    assert result.records and all(r.status == 200 for r in result.records)
    rate = summarize(result)["prefix_cache_hit_rate"]
    assert isinstance(rate, float)
    return rate


def test_kv_aware_on_the_engines_events_hits_more_than_round_robin() -> None:
    spread, precise = hit_rate("round_robin"), hit_rate("kv_aware")
    assert precise > spread + 0.2, (spread, precise)
    # events that never arrive in time and no speculative entries: kv_aware knows nothing
    blind = run(
        scenario(
            routing={"prefill": "kv_aware", "decode": "kv_aware",
                     "kv_aware": {"speculative_ttl_s": 0.001}},
            fleet={"prefill": 4, "decode": 2, "prefix_caching": True, "kv_cache_tokens": 6400},
            workload=SHARED,
            sim={"seed": 5, "kv_event_delay_s": 1000.0},
        )
    )  # fmt: skip
    assert summarize(blind)["prefix_cache_hit_rate"] < precise - 0.2
