"""Text and chat prompts scored by ``kv_aware`` through an engine's ``/tokenize``
(``[routing.kv_aware] tokenize = true``), live over 127.0.0.1 with emulated engines that publish
their prefix caches: a prefix cached on one producer by a text (or chat) request sent to it
directly is then routed to that producer, hitting the tokens the index predicted; without the
option the same prompts have no identity. A failed tokenize places the request on load alone and
never charges the engine."""

from __future__ import annotations

import random
from typing import Any

import httpx

from narwhal.emulator.text import prompt_text, token_ids
from tests.live.conftest import Emulator, RouterHandle, Servers, start_emulator
from tests.live.conftest import start_router as _start_router
from tests.live.test_kv_events_live import CHAIN, hits, prefix

HTTP = httpx.Client(timeout=10)
BLOCK = 16


def fleet(servers: Servers, tokenize: bool) -> tuple[list[Emulator], RouterHandle]:
    producers = [start_emulator(servers, "prefill", kv_events_port=0) for _ in range(2)]
    consumer = start_emulator(servers, "decode")
    engines: list[dict[str, Any]] = []
    for p in producers:
        assert p.app.kv_events is not None
        engines.append({"url": p.url, "role": "prefill", "kv_events": p.app.kv_events.endpoint})
    engines.append({"url": consumer.url, "role": "decode"})
    # a generous tokenize bound: a loaded test machine must not turn this into a timeout test
    kv = {"speculative_ttl_s": 0.001, "load_weight": 0.0, "tokenize": tokenize,
          "tokenize_timeout_s": 5.0}  # fmt: skip
    router = _start_router(servers, engines, routing={"prefill": "kv_aware", "kv_aware": kv})
    router.wait_for(lambda: all(
        router.engine(p.url)["kv_events"]["connected"] for p in producers))  # fmt: skip
    return producers, router


def post(url: str, body: dict[str, Any], chat: bool) -> httpx.Response:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return HTTP.post(url + path, json={"model": "tiny-llama", "max_tokens": 2, **body})


def held_blocks(router: RouterHandle, url: str, body: dict[str, Any], chat: bool) -> int:
    """The blocks of ``body``'s prompt, as the engines tokenize it, the index says ``url``
    holds."""
    index = router.router.policies.placement.kv_index
    return index.overlap(url, CHAIN.chain(token_ids(prompt_text(body, chat))), 1e18)


def text(shared: str, tail: str) -> dict[str, Any]:
    return {"prompt": shared + tail}


def chat(shared: str, tail: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": shared}, {"role": "user", "content": tail}]}


def route_on_cached_prefixes(router: RouterHandle, producers: list[Emulator]) -> list[int]:
    """For text and chat prompts in turn: cache a prefix on a producer directly, send a prompt
    sharing it through the router; the prompt tokens each hit on the producer that holds it."""
    rng = random.Random(8)  # (checked: the seeded tie-breaks alone miss at once)
    got = []
    for n in range(8):
        is_chat = n % 2 == 1
        build = chat if is_chat else text
        target = producers[rng.randrange(2)]
        warm, asked = build(prefix(700 + n), " warm-up"), build(prefix(700 + n), " question")
        assert post(target.url, warm, is_chat).status_code == 200  # straight to the engine
        router.wait_for(lambda: held_blocks(router, target.url, warm, is_chat) >= 12)  # noqa: B023
        shared = held_blocks(router, target.url, asked, is_chat)
        assert shared >= 12
        before = [hits(p) for p in producers]
        assert post(router.url, asked, is_chat).status_code == 200
        rose = [hits(p) - b for p, b in zip(producers, before, strict=True)]
        got.append(rose[producers.index(target)] if sum(rose) == shared * BLOCK else -1)
    return got


def test_text_and_chat_prompts_are_routed_on_the_ids_an_engine_tokenized(
    servers: Servers,
) -> None:
    producers, router = fleet(servers, tokenize=True)
    got = route_on_cached_prefixes(router, producers)
    assert router.status()["tokenize"] == {
        "tokenized": 8,
        "no_engine": 0,
        "timed_out": 0,
        "failed": 0,
    }
    assert all(hit >= 12 * BLOCK for hit in got), got


def test_without_the_option_text_prompts_have_no_identity(servers: Servers) -> None:
    producers, router = fleet(servers, tokenize=False)
    got = route_on_cached_prefixes(router, producers)
    assert any(hit <= 0 for hit in got), got  # placed on the seeded tie-break: misses
    assert "tokenize" not in router.status()


def test_a_failed_tokenize_places_on_load_alone_and_charges_no_engine(servers: Servers) -> None:
    producers, router = fleet(servers, tokenize=True)
    # a model no engine serves: /tokenize answers 404, the request goes on without ids, and
    # the engine's 404 on the inference route is the client's answer, as without tokenizing
    reply = HTTP.post(
        router.url + "/v1/completions",
        json={"model": "no-such-model", "prompt": prefix(800), "max_tokens": 2},
    )
    assert reply.status_code == 404
    assert router.status()["tokenize"]["failed"] == 1
    for p in producers:
        engine = router.engine(p.url)
        assert engine["state"] == "ready" and engine["failure_streak"] == 0
    assert post(router.url, text(prefix(801), " after"), False).status_code == 200
    assert router.status()["tokenize"]["tokenized"] == 1
