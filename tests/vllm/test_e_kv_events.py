"""A real vLLM 0.32 engine's KV cache events, read by the router's own pieces: the events reach
the router's index with the block hashes the router computes for the prompt, a request
sharing the prefix gets exactly the ``cached_tokens`` the index predicted, and ``narwhal
preflight`` passes its KV event check against the engine.

One plain engine (no KV connector, both cores) started for this module with
``--kv-events-config`` (ZMQ PUB and replay ROUTER on loopback) and
``--enable-prompt-tokens-details``; the CPU backend's KV blocks are 128 tokens."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from narwhal.core.config import parse_config
from narwhal.core.routing.block_identity import VllmBlockHasher
from narwhal.core.routing.kv_index import KvIndex
from narwhal.live.kv_events import KvEventSubscriber
from narwhal.live.preflight import format_table, run_preflight
from narwhal.vllm.processes import EngineProcess, EngineSpec, free_port, start_engines
from narwhal.vllm.processes import stop_all as stop_engines
from tests.vllm.conftest import VENV
from tests.vllm.harness import MODEL

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

BLOCK = 128
HASHER = VllmBlockHasher(block_size=BLOCK)


@pytest.fixture(scope="module")
def engine(
    model_dir: Path, log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EngineProcess, str, str]]:
    # vLLM binds its PUB socket only on a wildcard or ipc endpoint (a host one it connects to):
    # a Unix socket keeps it off the network
    pub = f"ipc://{tmp_path_factory.mktemp('kv-events') / 'pub.sock'}"
    replay = free_port()
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": pub,
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
    }
    spec = EngineSpec(
        "kv-events",
        model_dir,
        free_port(),
        cpu="0-1",
        extra_args=(
            "--kv-events-config", json.dumps(events),
            "--enable-prompt-tokens-details",
            "--block-size", str(BLOCK),
        ),
    )  # fmt: skip
    (started,) = start_engines([spec], log_dir, venv=VENV)
    try:
        yield started, pub, f"tcp://127.0.0.1:{replay}"
    finally:
        stop_engines([started])


def test_events_reach_the_index_and_predict_the_cached_tokens(
    engine: tuple[EngineProcess, str, str],
) -> None:
    process, endpoint, replay = engine
    url = process.spec.url
    config = parse_config({"engines": [
        {"url": url, "role": "both", "kv_events": endpoint, "kv_events_replay": replay},
    ]})  # fmt: skip
    index = KvIndex()
    rng = random.Random(38)
    shared = [1] + [rng.randrange(10, 100) for _ in range(3 * BLOCK - 1)]
    first = shared + [rng.randrange(10, 100) for _ in range(20)]
    second = shared + [rng.randrange(10, 100) for _ in range(30)]

    def complete(client: httpx.Client, ids: list[int]) -> dict:
        body = {"model": MODEL, "prompt": ids, "max_tokens": 1}
        reply = client.post(url + "/v1/completions", json=body, timeout=120)
        reply.raise_for_status()
        data: dict = reply.json()
        return data

    async def scenario() -> tuple[int, dict]:
        subscriber = KvEventSubscriber(lambda: config.engines, lambda: index)
        async with anyio.create_task_group() as group:
            group.start_soon(subscriber.run)
            deadline = time.monotonic() + 10
            while not subscriber.streams[url].up:
                assert time.monotonic() < deadline, "the engine's KV event stream never connected"
                await anyio.sleep(0.05)
            with httpx.Client() as client:
                await anyio.to_thread.run_sync(complete, client, first)
                deadline = time.monotonic() + 20
                while index.overlap(url, HASHER.chain(second), 1e18) < 3:
                    assert time.monotonic() < deadline, f"index: {index.blocks(url)} blocks"
                    await anyio.sleep(0.05)
                predicted = index.overlap(url, HASHER.chain(second), 1e18) * BLOCK
                usage = await anyio.to_thread.run_sync(complete, client, second)
            group.cancel_scope.cancel()
        return predicted, usage

    predicted, reply = anyio.run(scenario)
    assert predicted == 3 * BLOCK
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == predicted


def test_preflight_passes_the_kv_event_check(engine: tuple[EngineProcess, str, str]) -> None:
    process, endpoint, _ = engine
    config = parse_config({
        "engines": [{"url": process.spec.url, "role": "both", "kv_events": endpoint}],
        "routing": {"decode": "kv_aware", "kv_aware": {"block_size": BLOCK}},
    })  # fmt: skip
    rows = anyio.run(lambda: run_preflight(config))
    kv = [row for row in rows if row.check == "kv_events"]
    assert len(kv) == 1 and kv[0].passed, format_table(rows)
