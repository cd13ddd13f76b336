"""``prefix_affinity`` through a live router in front of emulated engines on loopback: requests
repeating a few long shared prefixes go to the engines that already hold them, as the engines'
own prefix-cache counters (``vllm:prefix_cache_hits_total`` on their /metrics) show; the same
workload placed at random (seeded) spreads the hits and yields fewer of them.

The workload: ``GROUPS`` groups, each with its own long prefix, ``USERS`` requests per group
(each the prefix plus a question of its own), sent one at a time, the groups interleaved. Two
producers and two consumers; both phases use the policy under test. After every request each
engine's /metrics is read, so every request is traced to the producer and the consumer that
served it (the one whose ``vllm:prefix_cache_queries_total`` rose) and to the hits it made.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import httpx
import pytest

from tests.live.conftest import Emulator, Servers, metric_value, start_emulator, start_router

GROUPS, USERS = 4, 4
BLOCK = 16  # the emulator's block size, in tokens (one token per character, plus BOS)
PREFIX_CHARS = 26 * BLOCK - 1  # BOS + the prefix fill 26 whole blocks exactly
SHARED_TOKENS = (PREFIX_CHARS + 1) // BLOCK * BLOCK  # what a repeat finds cached: 416
HTTP = httpx.Client(timeout=10)
# the router's seed: its tie-breaks place the groups' first requests (every index empty) two
# groups on each engine of each phase, so both engines of a phase hold groups of their own
SEED = 4


def group_prefix(group: int) -> str:
    """A long prefix of its own per group (seeded letters after a group tag), differing from the
    others from its first byte: groups sharing even one 16-byte block would match each other's
    engine in the router's index."""
    letters = random.Random(group)
    head = f"{group}: the context of this group, "
    return head + "".join(letters.choice("abcdefgh ") for _ in range(PREFIX_CHARS - len(head)))


def question(user: int) -> str:
    """A question of its own per user, differing from the others from its first character
    (so no two prompts of a group share a block past the prefix)."""
    return f"{'ABCDEFGH'[user]} asks question number {user} about it?"


def workload() -> list[tuple[int, str]]:
    """(group, prompt) in the order sent: the groups interleaved, one user of each at a time."""
    return [(g, group_prefix(g) + question(u)) for u in range(USERS) for g in range(GROUPS)]


@dataclass
class Served:
    """One request as the engines' /metrics and the client saw it."""

    group: int
    producer: int  # index of the producer whose prefix-cache queries rose
    consumer: int
    producer_hits: list[float]  # the rise of each producer's hit counter
    consumer_hits: list[float]
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens, as the client got it


@dataclass
class Run:
    producers: list[Emulator]
    consumers: list[Emulator]
    served: list[Served] = field(default_factory=list)

    def hits(self, engines: list[Emulator]) -> list[float]:
        return [hits for _, hits in counters(engines)]


def counters(engines: list[Emulator]) -> list[tuple[float, float]]:
    """Each engine's (prefix-cache queries, hits) from its /metrics."""
    texts = [HTTP.get(engine.url + "/metrics").text for engine in engines]
    return [
        (
            metric_value(text, "vllm:prefix_cache_queries_total"),
            metric_value(text, "vllm:prefix_cache_hits_total"),
        )
        for text in texts
    ]


def rises(
    before: list[tuple[float, float]], after: list[tuple[float, float]]
) -> tuple[int, list[float]]:
    """The one engine whose query counter rose, and the rise of every engine's hit counter."""
    queried = [index for index, (a, b) in enumerate(zip(before, after, strict=True)) if b[0] > a[0]]
    assert len(queried) == 1, f"expected one engine queried, got {queried}"
    return queried[0], [b[1] - a[1] for a, b in zip(before, after, strict=True)]


# the long shared prompts take the emulators a while on a loaded machine; a timeout here would
# retry a leg on another engine and blur the counters the tests read
PATIENT = {
    "first_token_timeout_s": 10.0,
    "decode_read_timeout_s": 10.0,
    "request_timeout_s": 30.0,
    "max_handoff_age_s": 10.0,
}


def run(servers: Servers, policy: str) -> Run:
    """The workload through a fresh fleet (empty caches) whose both phases use ``policy``."""
    producers = [start_emulator(servers, "prefill") for _ in range(2)]
    fleet = Run(producers, [start_emulator(servers, "decode") for _ in range(2)])
    engines = [{"url": e.url, "role": "prefill"} for e in fleet.producers]
    engines += [{"url": e.url, "role": "decode"} for e in fleet.consumers]
    handle = start_router(
        servers,
        engines,
        routing={"prefill": policy, "decode": policy},
        seed=SEED,
        engine=PATIENT,  # placement is measured here, not timeouts: one leg each, never retried
    )
    client = handle.client()
    seen_p, seen_c = counters(fleet.producers), counters(fleet.consumers)
    for group, prompt in workload():
        reply = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=2)
        now_p, now_c = counters(fleet.producers), counters(fleet.consumers)
        producer, producer_hits = rises(seen_p, now_p)
        consumer, consumer_hits = rises(seen_c, now_c)
        details = reply.usage.prompt_tokens_details if reply.usage else None
        cached = details.cached_tokens if details and details.cached_tokens is not None else -1
        fleet.served.append(Served(group, producer, consumer, producer_hits, consumer_hits, cached))
        seen_p, seen_c = now_p, now_c
    return fleet


@pytest.fixture(scope="module")
def runs(module_servers: Servers) -> dict[str, Run]:
    """The workload under each policy, each through a fleet of its own (run once per module)."""
    return {policy: run(module_servers, policy) for policy in ("prefix_affinity", "random")}


def expected_hits(served: list[Served], side: str) -> list[float]:
    """Each request's hit on the engine that served it, as a prefix cache must make it: the
    shared prefix once that engine has served the group before, nothing the first time."""
    seen: set[tuple[int, int]] = set()
    out: list[float] = []
    for request in served:
        engine = request.producer if side == "producer" else request.consumer
        out.append(SHARED_TOKENS if (request.group, engine) in seen else 0)
        seen.add((request.group, engine))
    return out


def check_hits_follow_placement(served: list[Served]) -> None:
    """Only the engine that served a request made a hit, exactly the one its cache must make,
    and the client was told the producer's."""
    for side in ("producer", "consumer"):
        for request, hit in zip(served, expected_hits(served, side), strict=True):
            engine = request.producer if side == "producer" else request.consumer
            rises = request.producer_hits if side == "producer" else request.consumer_hits
            assert rises[engine] == hit, (side, request)
            assert rises[1 - engine] == 0, (side, request)
    for request, hit in zip(served, expected_hits(served, "producer"), strict=True):
        assert request.cached_tokens == hit, request


def test_prefix_affinity_sends_each_group_to_the_engines_that_hold_its_prefix(
    runs: dict[str, Run],
) -> None:
    fleet = runs["prefix_affinity"]
    check_hits_follow_placement(fleet.served)
    for side in ("producer", "consumer"):
        owner: dict[int, set[int]] = {}
        for request in fleet.served:
            engine = request.producer if side == "producer" else request.consumer
            owner.setdefault(request.group, set()).add(engine)
        # every group stayed on one engine per phase, both engines holding groups (SEED), so
        # each engine's hits are its own groups' repeats and nobody else's
        assert all(len(engines) == 1 for engines in owner.values()), (side, owner)
        assert {next(iter(engines)) for engines in owner.values()} == {0, 1}, (side, owner)
    repeats = GROUPS * (USERS - 1)
    assert sum(fleet.hits(fleet.producers)) == repeats * SHARED_TOKENS
    assert sum(fleet.hits(fleet.consumers)) == repeats * SHARED_TOKENS


def test_random_placement_spreads_the_hits_and_makes_fewer(runs: dict[str, Run]) -> None:
    placed_at_random, by_prefix = runs["random"], runs["prefix_affinity"]
    check_hits_follow_placement(placed_at_random.served)
    for side in ("producers", "consumers"):
        spread = placed_at_random.hits(getattr(placed_at_random, side))
        kept = by_prefix.hits(getattr(by_prefix, side))
        assert all(hits > 0 for hits in spread), (side, spread)  # both engines hit
        assert sum(spread) < sum(kept), (side, spread, kept)
