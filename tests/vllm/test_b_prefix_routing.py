"""``prefix_affinity`` in front of two real NixlConnector producers: vLLM's own prefix-cache
counter (``vllm:prefix_cache_hits_total``) rises on the producer the router keeps a prefix on
and not on the other; placed at random (seeded), the same workload spreads the hits over both
producers and makes fewer of them.

What fits 2 cores and 24 GiB: the session's producer (core 0) and consumer (core 1), plus a
second producer started for this module and stopped after it, on core 0 beside the first
producer (1 GiB of KV cache like the others). Not on core 1: a producer pinned to the core of
the consumer that pulls from it stalls the pulls (a direct handoff took 31 s, the next timed
out at 60 s; on core 0 the same handoffs take 0.4-2 s).

The workload: ``GROUPS`` groups, each a long prefix of its own (exactly ``SHARED_TOKENS``
tokens with BOS: whole 128-token CPU KV blocks) followed by ``USERS`` questions of its own,
sent one at a time through ``narwhal serve``, the groups interleaved. After every request both
producers' /metrics are read (polled, bounded): the one whose
``vllm:prefix_cache_queries_total`` rose served its prefill, and the rise of each hit counter
is what that request found cached. Each policy's run uses prefixes of its own, so its first
request of a group meets a cold cache everywhere. The one consumer's own prefix cache is read
too: it holds every group after the group's first pull, whichever producer computed it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from narwhal.vllm.processes import EngineProcess, EngineSpec, free_port, metric_sum, start_engines
from narwhal.vllm.processes import stop_all as stop_engines
from tests.vllm.conftest import NOTES, TIMINGS, VENV, Fleet
from tests.vllm.handoff import wait_pair_ready
from tests.vllm.harness import MODEL, Narwhal, fleet_config_text

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

GROUPS, USERS = 2, 4
BLOCK = 128  # vLLM's KV block size on CPU, in tokens (the tiny model: one token per character)
PREFIX_CHARS = 5 * BLOCK - 1  # BOS + the prefix fill 5 blocks exactly
SHARED_TOKENS = (PREFIX_CHARS + 1) // BLOCK * BLOCK  # what a repeat finds cached: 640
# the router's seed (``narwhal serve --seed``): under prefix_affinity its tie-breaks put the two
# groups' first requests (no index matching yet) on different producers
SEED = 0
POLL_S = 15.0  # bound on waiting for an engine's counters to show a request
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
SOURCE = "vllm:prompt_tokens_by_source_total"


def group_prefix(tag: str, group: int) -> str:
    """A long prefix no other test sends: the group and the run's tag, then seeded letters.
    The group comes first: prompts of two groups sharing even their first 16 bytes (one block
    of the router's index) would match, and prefix_affinity would send the second group to the
    first one's producer."""
    letters = random.Random(f"{tag}/{group}")
    head = f"[group {group} of {tag}] "
    return head + "".join(letters.choice("abcdefghij ") for _ in range(PREFIX_CHARS - len(head)))


def question(user: int) -> str:
    """A question of its own per user, differing from the others from its first character."""
    return f"{'ABCDEFGH'[user]} asks question number {user} about it?"


def workload(tag: str) -> list[tuple[int, str]]:
    return [(g, group_prefix(tag, g) + question(u)) for u in range(USERS) for g in range(GROUPS)]


def counters(engines: list[EngineProcess]) -> list[tuple[float, float]]:
    """Each engine's (prefix-cache queries, hits), in tokens, from its /metrics."""
    texts = [engine.metrics() for engine in engines]
    return [(metric_sum(text, QUERIES), metric_sum(text, HITS)) for text in texts]


@dataclass
class Served:
    group: int
    producer: int  # which producer's query counter rose
    hits: list[float]  # the rise of each producer's hit counter


@dataclass
class Run:
    policy: str
    served: list[Served] = field(default_factory=list)
    consumer_hits: float = 0.0  # the consumer's own prefix-cache hits over the run
    consumer_pulled: float = 0.0  # prompt tokens the consumer pulled (external_kv_transfer)
    prompt_tokens: int = 0  # of every request of the run
    seconds: float = 0.0

    def totals(self) -> list[float]:
        return [sum(request.hits[index] for request in self.served) for index in (0, 1)]


def wait_for_prefill(
    producers: list[EngineProcess], before: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The producers' counters once one of them shows a new query (bounded by POLL_S)."""
    end = time.monotonic() + POLL_S
    while True:
        now = counters(producers)
        if any(b[0] > a[0] for a, b in zip(before, now, strict=True)):
            return now
        if time.monotonic() > end:
            raise AssertionError(f"no producer counted a prefix-cache query in {POLL_S} s")
        time.sleep(0.1)


def run_policy(
    fleet: Fleet, producers: list[EngineProcess], policy: str, tmp_path: Path, log_dir: Path
) -> Run:
    """The workload through a ``narwhal serve`` whose prefill phase uses ``policy``."""
    config = tmp_path / f"narwhal-{policy}.toml"
    config.write_text(fleet_config_text(producers, [fleet.consumer], routing={"prefill": policy}))
    router = Narwhal(config, log_dir / f"narwhal-prefix-{policy}.log", seed=SEED).start()
    result = Run(policy)
    started = time.monotonic()
    consumer_before = fleet.consumer.metric(HITS)
    pulled_before = fleet.consumer.metric(SOURCE, source="external_kv_transfer")
    try:
        client = router.client()
        seen = counters(producers)
        for group, prompt in workload(policy):
            done = client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=2, temperature=0
            )
            assert done.usage is not None and done.usage.prompt_tokens == len(prompt) + 1
            result.prompt_tokens += done.usage.prompt_tokens
            now = wait_for_prefill(producers, seen)
            queried = [i for i, (a, b) in enumerate(zip(seen, now, strict=True)) if b[0] > a[0]]
            assert len(queried) == 1, f"both producers counted a query: {seen} -> {now}"
            hits = [b[1] - a[1] for a, b in zip(seen, now, strict=True)]
            result.served.append(Served(group, queried[0], hits))
            seen = now
    except BaseException:
        print(f"--- {router.log_path.name} (tail)\n{router.log()[-3000:]}")
        raise
    finally:
        router.stop()
    result.consumer_hits = fleet.consumer.metric(HITS) - consumer_before
    pulled = fleet.consumer.metric(SOURCE, source="external_kv_transfer") - pulled_before
    result.consumer_pulled = pulled
    result.seconds = time.monotonic() - started
    TIMINGS[f"prefix routing: {policy} run ({len(result.served)} requests)"] = result.seconds
    return result


@pytest.fixture(scope="module")
def second_producer(fleet: Fleet, model_dir: Path, log_dir: Path) -> Iterator[EngineProcess]:
    """A second NixlConnector producer (core 0, module docstring), for this module only."""
    started = time.monotonic()
    spec = EngineSpec("producer-b", model_dir, free_port(), "kv_producer", free_port(), cpu="0")
    engines = start_engines([spec], log_dir, venv=VENV)
    try:
        TIMINGS["second producer healthy"] = time.monotonic() - started
        errors = wait_pair_ready(engines[0], fleet.consumer)  # the consumer's first handshake
        if errors:
            NOTES.append(f"handoffs from producer-b failed before it was ready: {errors}")
        yield engines[0]
    finally:
        stop_engines(engines)


@pytest.fixture(scope="module")
def runs(
    fleet: Fleet,
    second_producer: EngineProcess,
    tmp_path_factory: pytest.TempPathFactory,
    log_dir: Path,
) -> dict[str, Run]:
    """The workload under prefix_affinity, then under random (each run once per module)."""
    fleet.ensure_pair()
    producers = [fleet.producer, second_producer]
    tmp_path = tmp_path_factory.mktemp("prefix-routing")
    results = {
        p: run_policy(fleet, producers, p, tmp_path, log_dir) for p in ("prefix_affinity", "random")
    }
    for result in results.values():
        NOTES.append(
            f"prefix routing, {result.policy}: producer hits {result.totals()} tokens, "
            f"placements {[r.producer for r in result.served]}, "
            f"consumer hits {result.consumer_hits:g} tokens, "
            f"consumer pulled {result.consumer_pulled:g} tokens"
        )
    return results


def expected_hits(served: list[Served]) -> list[float]:
    """Each request's hit on the producer that served it, as vLLM's prefix cache must make it:
    the whole shared prefix once that producer has prefilled the group, nothing before."""
    seen: set[tuple[int, int]] = set()
    out: list[float] = []
    for request in served:
        out.append(SHARED_TOKENS if (request.group, request.producer) in seen else 0)
        seen.add((request.group, request.producer))
    return out


def check_hits_follow_placement(served: list[Served]) -> None:
    for request, hit in zip(served, expected_hits(served), strict=True):
        assert request.hits[request.producer] == hit, request
        assert request.hits[1 - request.producer] == 0, request


def test_prefix_affinity_keeps_each_prefix_on_the_producer_that_cached_it(
    runs: dict[str, Run],
) -> None:
    run = runs["prefix_affinity"]
    check_hits_follow_placement(run.served)
    owners = {g: {r.producer for r in run.served if r.group == g} for g in range(GROUPS)}
    assert all(len(producers) == 1 for producers in owners.values()), owners
    assert {next(iter(p)) for p in owners.values()} == {0, 1}, owners  # one group each (SEED)
    assert run.totals() == [(USERS - 1) * SHARED_TOKENS] * 2


def test_the_one_consumer_finds_every_repeated_prefix_in_its_own_cache_and_pulls_the_rest(
    runs: dict[str, Run],
) -> None:
    # whichever producer prefilled it: the consumer cached each group's blocks at its first
    # pull, and pulls only what its own cache lacks (NixlConnector asks for the uncached rest)
    for run in runs.values():
        assert run.consumer_hits == GROUPS * (USERS - 1) * SHARED_TOKENS, run.policy
        assert run.consumer_pulled == run.prompt_tokens - run.consumer_hits, run.policy


def test_random_placement_spreads_the_hits_over_both_producers_and_makes_fewer(
    runs: dict[str, Run],
) -> None:
    placed_at_random, by_prefix = runs["random"], runs["prefix_affinity"]
    check_hits_follow_placement(placed_at_random.served)
    spread = placed_at_random.totals()
    assert all(hits > 0 for hits in spread), spread
    assert sum(spread) < sum(by_prefix.totals()), (spread, by_prefix.totals())
