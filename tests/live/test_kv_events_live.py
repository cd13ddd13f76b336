"""``kv_aware`` on the engines' own KV cache events, live: a router on loopback subscribed to
emulated engines that publish their prefix caches over ZMQ as vLLM does.

A prefix is cached on one producer by a request sent to it directly (the router never placed
it, so it has no speculative entry for it: only the engine's events can tell the router), then
a request sharing the prefix goes through the router and must be prefilled on that producer,
hitting the cached tokens the index predicted. Speculative entries expire at once (1 ms) and load
does not count (weight 0), so a miss of the index would leave the choice to the seeded
tie-break: over several prefixes on alternating producers that cannot pass by chance."""

from __future__ import annotations

import random

import httpx

from narwhal.core.routing.block_identity import VllmBlockHasher
from narwhal.emulator.text import token_ids
from tests.live.conftest import Emulator, RouterHandle, Servers, metric_value, start_emulator
from tests.live.conftest import start_router as _start_router

HTTP = httpx.Client(timeout=10)
BLOCK = 16
PREFIX_CHARS = 12 * BLOCK - 1  # BOS + prefix: 12 whole blocks
CHAIN = VllmBlockHasher(block_size=BLOCK)


def prefix(n: int) -> str:
    letters, head = random.Random(n), f"{n}:"
    return head + "".join(letters.choice("abcdefgh ") for _ in range(PREFIX_CHARS - len(head)))


def complete(url: str, text: str, model: str = "tiny-llama") -> dict:
    reply = HTTP.post(
        url + "/v1/completions",
        json={"model": model, "prompt": token_ids(text), "max_tokens": 2},
    )
    reply.raise_for_status()
    data: dict = reply.json()
    return data


def hits(engine: Emulator) -> float:
    return metric_value(HTTP.get(engine.url + "/metrics").text, "vllm:prefix_cache_hits_total")


def fleet(servers: Servers) -> tuple[list[Emulator], Emulator, RouterHandle]:
    producers = [start_emulator(servers, "prefill", kv_events_port=0) for _ in range(2)]
    consumer = start_emulator(servers, "decode")
    engines = [
        {
            "url": p.url,
            "role": "prefill",
            "kv_events": p.app.kv_events.endpoint,
            "kv_events_replay": p.app.kv_events.replay_endpoint,
        }
        for p in producers
        if p.app.kv_events is not None
    ] + [{"url": consumer.url, "role": "decode"}]
    routing = {"prefill": "kv_aware", "kv_aware": {"speculative_ttl_s": 0.001, "load_weight": 0.0}}
    router = _start_router(servers, engines, routing=routing)
    router.wait_for(lambda: all(
        metric_value(router.metrics(), "narwhal_kv_events_stream_up", engine=p.url) == 1.0
        for p in producers
    ))  # fmt: skip
    return producers, consumer, router


def held(router: RouterHandle, url: str, text: str) -> int:
    """The blocks of ``text``'s prompt the router's index says ``url`` holds."""
    index = router.router.policies.placement.kv_index
    return index.overlap(url, CHAIN.chain(token_ids(text)), 1e18)  # reported only


def test_a_request_routed_on_events_lands_on_the_engine_holding_its_prefix(
    servers: Servers,
) -> None:
    producers, _, router = fleet(servers)
    rng = random.Random(8)  # (checked: the seeded tie-breaks alone miss at once)
    for n in range(8):
        target = producers[rng.randrange(2)]
        shared = prefix(n)
        complete(target.url, shared + " warm-up")  # straight to the engine: no placement
        router.wait_for(lambda: held(router, target.url, shared) == 12)  # noqa: B023
        before = [hits(p) for p in producers]
        reply = complete(router.url, shared + " the question")
        rose = [hits(p) - b for p, b in zip(producers, before, strict=True)]
        assert rose[producers.index(target)] == 12 * BLOCK, (n, rose)
        assert sum(rose) == 12 * BLOCK
        assert reply["choices"][0]["text"]
    metrics = router.metrics()
    assert (
        sum(
            metric_value(metrics, "narwhal_kv_events_batches_total", engine=p.url)
            for p in producers
        )
        >= 8
    )


def test_a_missed_batch_is_replayed_and_a_lost_stream_falls_back_uncharged(
    servers: Servers,
) -> None:
    producers, _, router = fleet(servers)
    first = producers[0]
    publisher = first.app.kv_events
    assert publisher is not None
    complete(first.url, prefix(100) + " starts the sequence")
    router.wait_for(lambda: held(router, first.url, prefix(100)) == 12)
    publisher.drop_next = 1  # this engine's next batch never reaches the router
    complete(first.url, prefix(101) + " lost")
    complete(first.url, prefix(102) + " after the loss")
    # the second batch shows the gap; the replay socket supplies the lost one
    router.wait_for(lambda: held(router, first.url, prefix(102)) == 12)
    router.wait_for(lambda: held(router, first.url, prefix(101)) == 12)
    index = router.router.policies.placement.kv_index
    assert index.gaps == 0 and not index.approximate(first.url)
    metrics = router.metrics()
    assert metric_value(metrics, "narwhal_kv_events_replays_total", engine=first.url) >= 1
    assert metric_value(metrics, "narwhal_kv_events_replayed_total", engine=first.url) >= 1

    publisher.close()  # the stream goes down; the engine itself still serves
    router.wait_for(lambda: metric_value(
        router.metrics(), "narwhal_kv_events_stream_up", engine=first.url) == 0.0)  # fmt: skip
    assert index.approximate(first.url) and index.blocks(first.url) == 0
    assert metric_value(router.metrics(), "narwhal_kv_events_downs_total", engine=first.url) == 1
    for n in range(4):  # placed on load alone now; the engine is never charged
        assert complete(router.url, prefix(200 + n) + " after the stream died")["choices"]
    assert router.engine(first.url)["state"] == "ready"
