"""The kv_aware policy: one cost of uncached blocks and reservations, speculative entries for
what it just placed, a softmax draw with a temperature, and a clear refusal without the engines'
block identity."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from narwhal.core.config import ConfigError, KvAwareSettings
from narwhal.core.requests import COMPLETIONS, ClientRequest
from narwhal.core.routing.kv_aware import KvAware
from narwhal.core.routing.kv_events import BlockHash, BlockStored, EventBatch
from narwhal.core.routing.kv_index import KvIndex

A, B = "http://a", "http://b"


def chain_of(request: ClientRequest) -> Sequence[BlockHash] | None:
    """The test's block identity: the prompt's listed ids are its block hashes."""
    prompt = request.body.get("prompt")
    return prompt if isinstance(prompt, list) else None


def request(blocks: list[int] | str) -> ClientRequest:
    return ClientRequest("r", COMPLETIONS, {"prompt": blocks}, 0.0)


def policy(**settings: Any) -> tuple[KvAware, KvIndex, dict[str, dict[str, int]]]:
    counts = {A: {"prefill": 0, "decode": 0}, B: {"prefill": 0, "decode": 0}}
    index = KvIndex(speculative_ttl_s=settings.pop("ttl", 2.0))
    kv = KvAware("prefill", counts, random.Random(1), index, chain_of, KvAwareSettings(**settings))
    return kv, index, counts


def stored(index: KvIndex, url: str, *hashes: int) -> None:
    batch = EventBatch(0.0, (BlockStored(hashes, None, (), 16),))
    index.apply(url, index.expected(url) or 0, batch)


def test_the_engine_holding_the_prefix_wins_until_its_load_outweighs_it() -> None:
    kv, index, counts = policy(overlap_weight=1.0, load_weight=4.0, ttl=0.0)
    stored(index, B, 1, 2, 3, 4, 5)
    assert kv.costs([A, B], [1, 2, 3, 4, 5, 6], 0.0) == [(6.0, 0), (1.0, 5)]
    assert kv.choose([A, B], request([1, 2, 3, 4, 5, 6]), 0.0) == B
    counts[B]["prefill"] = 1  # 1 + 4 = 5 < 6: still B
    assert kv.choose([A, B], request([1, 2, 3, 4, 5, 6]), 0.0) == B
    counts[B]["prefill"] = 2  # 1 + 8 = 9 > 6: A
    assert kv.choose([A, B], request([1, 2, 3, 4, 5, 6]), 0.0) == A
    assert (kv.prompt_blocks, kv.held_blocks) == (18, 10)


def test_a_prompt_without_identity_is_placed_on_load_alone() -> None:
    kv, index, counts = policy()
    stored(index, B, 1)
    counts[B]["prefill"] = 1
    assert kv.choose([A, B], request("text"), 0.0) == A
    assert kv.choose([A, B], None, 0.0) == A


def test_speculative_entries_keep_a_burst_of_one_prefix_together_until_they_expire() -> None:
    kv, index, _ = policy(load_weight=0.0, ttl=1.0)
    first = kv.choose([A, B], request([7, 8, 9]), 0.0)
    assert all(kv.choose([A, B], request([7, 8, 9]), 0.5) == first for _ in range(5))
    assert index.blocks(first) == 0  # speculative only: no event came
    picks = {kv.choose([A, B], request([7, 8, 9]), 5.0 + i) for i in range(0, 40, 2)}
    assert picks == {A, B}  # expired: ties drawn at random again


def test_a_temperature_spreads_by_a_softmax_of_the_costs() -> None:
    kv, index, _ = policy(overlap_weight=1.0, load_weight=0.0, temperature=1.0, ttl=0.0)
    stored(index, B, 1)  # cost A 2, cost B 1: B with probability e / (1 + e) = 0.73
    picks = Counter(kv.choose([A, B], request([1, 2]), 0.0) for _ in range(2000))
    assert 0.69 < picks[B] / 2000 < 0.77


def test_kv_aware_without_a_block_identity_is_refused_with_the_reason() -> None:
    counts = {A: {"prefill": 0, "decode": 0}}
    reason = r"routing\.prefill = 'kv_aware' needs the engines' block identity"
    with pytest.raises(ConfigError, match=reason):
        KvAware("prefill", counts, random.Random(0), KvIndex(), None, KvAwareSettings())


def test_the_consumers_own_events_decide_how_much_of_a_prompt_is_uncached() -> None:
    from narwhal.core.config import RoutingSettings
    from narwhal.core.routing.disagg import Disaggregation

    counts = {A: {"prefill": 0, "decode": 0}, B: {"prefill": 0, "decode": 0}}
    index = KvIndex(speculative_ttl_s=0.0)

    def blocks_of(req: ClientRequest) -> Sequence[BlockHash] | None:
        return req.body.get("blocks")

    kv = KvAware("decode", counts, random.Random(1), index, blocks_of, KvAwareSettings())
    disagg = Disaggregation(RoutingSettings(remote_prefill_min_tokens=20), kv)
    prompt = ClientRequest("r", COMPLETIONS, {"prompt": list(range(70)), "blocks": [1, 2, 3, 4]}, 0)
    assert disagg.uncached_tokens(prompt, [A, B]) == 70 and not disagg.short_prompt(prompt, [A, B])
    stored(index, B, 1, 2, 3)  # 3 blocks of 16 tokens: 48 of the 70 held on B
    assert disagg.uncached_tokens(prompt, [A, B]) == 22
    stored(index, B, 4)
    assert disagg.uncached_tokens(prompt, [A, B]) == 6 and disagg.short_prompt(prompt, [A, B])
    assert disagg.uncached_tokens(prompt, [A]) == 70  # A holds nothing
