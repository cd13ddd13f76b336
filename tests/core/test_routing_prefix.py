"""prefix_affinity: the rendered prompt (every chat turn), chained full-block hashes, the
bounded LRU index and its bisected match, and the choice with its load guard at the exact edge."""

from __future__ import annotations

import hashlib
import random
import tracemalloc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.config import PrefixAffinitySettings
from narwhal.core.requests import CHAT, COMPLETIONS, ClientRequest
from narwhal.core.routing.policy import Counts
from narwhal.core.routing.prefix import (
    PrefixAffinity,
    PrefixIndex,
    block_hashes,
    rendered_prompt,
)

URLS = ["http://e0", "http://e1", "http://e2"]


def completion(prompt: Any) -> ClientRequest:
    return ClientRequest("r", COMPLETIONS, {"model": "m", "prompt": prompt}, 0.0)


def chat(*contents: str, **extra: Any) -> ClientRequest:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents)
    ]
    return ClientRequest("r", CHAT, {"model": "m", "messages": messages, **extra}, 0.0)


def test_a_completion_prompt_renders_as_its_text() -> None:
    assert rendered_prompt(completion("héllo")) == "héllo".encode()
    assert rendered_prompt(completion(["héllo"])) == "héllo".encode()  # a batch of one
    assert rendered_prompt(completion([1, 2, 3])) == b"[1,2,3]"
    assert rendered_prompt(completion([[1, 2, 3]])) == b"[1,2,3]"
    assert rendered_prompt(completion("\ud800x"))  # a lone surrogate (valid JSON) still renders


def test_a_chat_renders_every_turn_and_the_tools() -> None:
    one = rendered_prompt(chat("first question"))
    two = rendered_prompt(chat("first question", "an answer", "a follow-up"))
    assert two.startswith(one) and len(two) > len(one)
    assert b"a follow-up" in two and b"an answer" in two  # not only the first message
    # keys in another order are the same message
    swapped = ClientRequest(
        "r", CHAT, {"messages": [{"content": "first question", "role": "user"}]}, 0.0
    )
    assert rendered_prompt(swapped) == one
    tools = [{"type": "function", "function": {"name": "f"}}]
    with_tools = rendered_prompt(chat("first question", tools=tools))
    assert with_tools.endswith(one) and with_tools != one  # the tools come first


def test_blocks_are_full_chained_and_bounded() -> None:
    data = b"a" * 16 + b"b" * 16 + b"c" * 10  # two full blocks and a partial one
    chain = block_hashes(data, 16, 100)
    assert len(chain) == 2 and all(len(h) == 8 for h in chain)
    assert block_hashes(b"b" * 16, 16, 100)[0] != chain[1]  # chained: block 2 depends on block 1
    assert block_hashes(data[:32] + b"other", 16, 100) == chain  # the same prefix, same hashes
    assert block_hashes(b"x" * 15, 16, 100) == []
    # the hash of the previous block's digest followed by the block
    assert chain[1] == hashlib.blake2b(chain[0] + b"b" * 16, digest_size=8).digest()
    assert len(block_hashes(b"x" * 1600, 16, 7)) == 7  # no more than an index could hold
    assert block_hashes(b"x" * 1600, 16, 7) == block_hashes(b"x" * 1600, 16, 100)[:7]


def test_the_index_never_holds_more_than_its_capacity_and_evicts_lru() -> None:
    index = PrefixIndex(capacity=6)
    a = block_hashes(b"A" * 64, 16, 100)  # 4 blocks
    b = block_hashes(b"B" * 64, 16, 100)
    index.record(a)
    assert index.match(a) == 4 and len(index) == 4
    index.record(b)  # 8 blocks seen, 6 kept: a's last two blocks (its least recently used) go
    assert len(index) == 6
    assert index.match(b) == 4 and index.match(a) == 2
    index.record(a[:1])  # a's first block used again: a's second is now the least recent
    index.record(block_hashes(b"C" * 32, 16, 100))  # two more: a's second and b's last go
    assert len(index) == 6 and index.match(a) == 1 and index.match(b) == 3
    big = block_hashes(b"D" * 16 * 50, 16, 100)
    index.record(big)
    assert len(index) == 6 and index.match(big) == 6  # the chain's first six blocks
    assert index.match(a) == 0 and index.match(b) == 0


@settings(derandomize=True, max_examples=200)
@given(
    prompts=st.lists(st.text("ab", min_size=0, max_size=12), min_size=1, max_size=12),
    capacity=st.integers(1, 8),
    query=st.text("ab", max_size=12),
)
def test_the_bisected_match_is_the_longest_held_prefix(
    prompts: list[str], capacity: int, query: str
) -> None:
    index = PrefixIndex(capacity)
    for prompt in prompts:
        index.record(block_hashes(prompt.encode(), 2, 100))
        assert len(index) <= capacity
    chain = block_hashes(query.encode(), 2, 100)
    linear = 0
    while linear < len(chain) and chain[linear] in index:
        linear += 1
    assert index.match(chain) == linear


def test_the_index_memory_is_bounded_by_its_capacity() -> None:
    index = PrefixIndex(capacity=5000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(80):  # 16x the capacity, in distinct chains
            index.record(block_hashes(f"{i:04}".encode() * 1000, 4, 10_000))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(index) == 5000
    # the docstring's ~130 bytes a block (more while the dict holds freed slots), not the
    # 16 x 41 bytes of every digest ever made
    assert grown < 250 * 5000


def no_counts() -> Counts:
    return {url: {"prefill": 0, "decode": 0} for url in URLS}


def affinity(
    counts: Counts | None = None, seed: int = 0, threshold: int = 2, capacity: int = 1000
) -> PrefixAffinity:
    return PrefixAffinity(
        "prefill",
        counts if counts is not None else no_counts(),
        random.Random(seed),
        URLS,
        PrefixAffinitySettings(
            block_size=4, imbalance_threshold=threshold, max_blocks_per_engine=capacity
        ),
    )


SHARED = "system prompt shared by many requests " * 3


def test_the_longest_match_wins_and_the_choice_is_recorded() -> None:
    policy = affinity()
    policy.indexes["http://e1"].record(policy.chain(completion(SHARED[:40])))
    policy.indexes["http://e2"].record(policy.chain(completion(SHARED)))
    assert policy.choose(URLS, completion(SHARED + " question 1"), 0.0) == "http://e2"
    assert policy.choose(URLS, completion(SHARED[:44] + " other"), 0.0) in URLS[1:]
    assert policy.hits == 2 and policy.misses == 0
    # the choice was recorded: now e0 is the only engine that saw this prompt
    only_e0 = affinity()
    first = only_e0.choose(URLS, completion("a brand new prompt"), 0.0)
    assert only_e0.misses == 1
    assert all(only_e0.choose(URLS, completion("a brand new prompt!"), 0.0) == first
               for _ in range(5))  # fmt: skip
    assert only_e0.indexes[first].match(only_e0.chain(completion("a brand new prompt"))) == 4


def test_no_match_and_ties_go_to_least_reserved() -> None:
    counts = no_counts()
    counts["http://e0"]["prefill"] = 1
    counts["http://e2"]["prefill"] = 1
    policy = affinity(counts)
    assert policy.choose(URLS, completion("never seen before"), 0.0) == "http://e1"
    assert policy.choose(URLS, None, 0.0) == "http://e1"  # no request: nothing to match
    assert policy.choose(URLS, completion("abc"), 0.0) == "http://e1"  # no full block
    assert policy.misses == 3
    tied = affinity(counts)
    for url in ("http://e0", "http://e2"):
        tied.indexes[url].record(tied.chain(completion(SHARED)))
    counts["http://e0"]["prefill"] = 2  # both match fully: the less reserved, e2
    assert tied.choose(URLS, completion(SHARED), 0.0) == "http://e2"
    counts["http://e0"]["prefill"] = 1  # tied on reservations too: the seeded RNG
    picks = set()
    for seed in range(20):
        p = affinity(counts, seed)
        for url in ("http://e0", "http://e2"):
            p.indexes[url].record(p.chain(completion(SHARED)))
        picks.add(p.choose(URLS, completion(SHARED), 0.0))
    assert picks == {"http://e0", "http://e2"}


def test_the_load_guard_overrides_the_match_past_the_threshold_exactly() -> None:
    counts = no_counts()
    policy = affinity(counts, threshold=2)
    policy.indexes["http://e0"].record(policy.chain(completion(SHARED)))
    counts["http://e0"]["prefill"] = 3
    counts["http://e1"]["prefill"] = 1  # e0 holds 2 more than the least reserved: still e0
    counts["http://e2"]["prefill"] = 4
    assert policy.choose(URLS, completion(SHARED), 0.0) == "http://e0"
    counts["http://e0"]["prefill"] = 4  # 3 more: past the threshold, least_reserved (e1)
    assert policy.choose(URLS, completion(SHARED), 0.0) == "http://e1"
    assert (policy.hits, policy.overrides) == (1, 1)
    # only the candidates count: without e1, e0 is 0 above the least reserved (e2)
    assert policy.choose(["http://e0", "http://e2"], completion(SHARED), 0.0) == "http://e0"
    zero = affinity(counts, threshold=0)
    zero.indexes["http://e2"].record(zero.chain(completion(SHARED)))
    counts["http://e1"]["prefill"] = 4
    assert zero.choose(URLS, completion(SHARED), 0.0) == "http://e2"  # 4 - 4 = 0: not past 0


def test_a_placement_told_is_recorded() -> None:
    policy = affinity()
    policy.placed("http://e2", completion(SHARED), 0.0)
    assert policy.choose(URLS, completion(SHARED), 0.0) == "http://e2"
    policy.placed("http://e1", None, 0.0)  # nothing to record
    assert len(policy.indexes["http://e1"]) == 0


def test_memory_stays_bounded_per_engine() -> None:
    policy = affinity(capacity=50)
    rng = random.Random(1)
    for i in range(300):
        prompt = "".join(rng.choice("abcdef") for _ in range(rng.randrange(10, 400)))
        policy.choose(URLS, completion(f"{i} {prompt}"), 0.0)
    assert all(len(index) <= 50 for index in policy.indexes.values())
    assert sum(len(index) for index in policy.indexes.values()) == 150  # each is full


def test_choices_replay_per_seed() -> None:
    def run(seed: int) -> list[str]:
        policy = affinity(seed=seed, threshold=1)
        counts = policy._counts
        rng = random.Random(99)
        picks = []
        for i in range(200):
            prompt = SHARED[: rng.randrange(len(SHARED))] + str(rng.randrange(5))
            url = policy.choose(URLS, completion(prompt), float(i))
            counts[url]["prefill"] += 1
            if rng.random() < 0.5:
                counts[rng.choice(URLS)]["prefill"] = 0
            picks.append(url)
        return picks

    assert run(3) == run(3)
    assert run(3) != run(4)
