"""Preflight's KV event check: an engine a ``kv_aware`` phase places on publishes its KV cache
events where it is configured to, and names its blocks as the router does.

Rule kept here: the check uses the live subscription's own pieces (a ZMQ SUB on the
configured endpoint and topic, the core's decoder) and the router's own block identity
(:func:`narwhal.live.kv_events.live_block_chain`'s hasher), so a pass means the router, once
serving, will read this engine's events and its index hits will be real hits.

Theory of operation: subscribe and wait for the connection; send the engine a completion whose
prompt is fresh token ids (seeded per run from a random source: never cached) of a few full
blocks; then read the stream until a ``BlockStored`` carries the first block of that prompt as
the router hashes it. Each failure names what was wrong: no endpoint configured, no
connection, no event at all, or events whose hashes differ from the router's (a different
``--prefix-caching-hash-algo``, ``PYTHONHASHSEED``, block size or hash form than
``[routing.kv_aware]`` states).
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from narwhal.core.config import EngineEntry, KvAwareSettings
from narwhal.core.ports import Ports, Reply
from narwhal.core.routing.block_identity import VllmBlockHasher
from narwhal.core.routing.kv_events import BlockStored, KvEventError, decode_message

CONNECT_TIMEOUT_S = 3.0
EVENT_TIMEOUT_S = 5.0
PROMPT_BLOCKS = 3


async def _connected(monitor: zmq.asyncio.Socket) -> bool:
    with anyio.move_on_after(CONNECT_TIMEOUT_S):
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_CONNECTED:
                return True
    return False


async def check_kv_events(
    entry: EngineEntry,
    phases: list[str],
    settings: KvAwareSettings,
    ports: Ports,
    body: dict[str, Any],
) -> tuple[bool, str]:
    """Whether ``entry`` publishes KV events the router can use, and the detail for the table
    (``body``: a probe completion body, whose prompt is replaced here)."""
    needed = " and ".join(f"routing.{phase} = 'kv_aware'" for phase in phases)
    if entry.kv_events is None:
        return False, f"{needed} reads this engine's KV events: set its kv_events endpoint"
    hasher = VllmBlockHasher(
        block_size=settings.block_size,
        algo=settings.hash_algo,
        seed=settings.hash_seed,
        int_hashes=settings.int_block_hashes,
    )
    rng = random.Random()
    # id 1 first: BOS in Llama vocabularies and the emulator's, whose token prompts are taken
    # as text after their BOS (the emulator hashes a token prompt with its BOS); ids below 100
    # fit every vocabulary (the real-vLLM tests' tiny model has 104)
    ids = [1] + [rng.randrange(10, 100) for _ in range(PROMPT_BLOCKS * settings.block_size)]
    first = hasher.chain(ids)[0]
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, entry.kv_events_topic.encode("utf-8"))
        sub.connect(entry.kv_events)
        if not await _connected(monitor):
            return False, f"no KV event publisher answers at {entry.kv_events}"
        # the subscription reaches the publisher shortly after the connection
        await anyio.sleep(0.2)
        reply = await ports.transport.call(
            entry.url,
            "POST",
            "/v1/completions",
            {**body, "prompt": ids, "max_tokens": 1, "stream": False},
            {},
            ports.clock.now() + EVENT_TIMEOUT_S,
        )
        if not isinstance(reply, Reply) or reply.status != 200:
            why = f"status {reply.status}" if isinstance(reply, Reply) else "no reply"
            return False, f"the completion meant to cache a prompt failed ({why})"
        seen = 0
        with anyio.move_on_after(EVENT_TIMEOUT_S):
            while True:
                frames = await sub.recv_multipart()
                try:
                    message = decode_message(frames)
                except KvEventError as error:
                    return False, f"a KV event message cannot be read: {error}"
                for event in message.batch.events:
                    if isinstance(event, BlockStored):
                        seen += 1
                        if first in event.block_hashes:
                            return True, (
                                f"publishes KV events on {entry.kv_events}; block hashes match "
                                f"({settings.hash_algo}, block size {settings.block_size})"
                            )
        if seen:
            return False, (
                f"{seen} BlockStored events, none with the router's hash of the prompt: check "
                "[routing.kv_aware] block_size, hash_algo, hash_seed and int_block_hashes "
                "against the engine's --block-size, --prefix-caching-hash-algo, PYTHONHASHSEED "
                "and VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
            )
        return False, f"no KV event within {EVENT_TIMEOUT_S:g} s of caching a prompt"
    finally:
        sub.disable_monitor()
        monitor.close(linger=0)
        sub.close(linger=0)
        ctx.term()
