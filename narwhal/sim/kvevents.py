"""KV cache events in the simulation: each simulated engine's prefix cache publishes vLLM's
events, delivered to the router's KV index after a delay, and the router hashes prompts as the
simulated engines do.

Rule kept here: events flow only when a phase is placed by ``kv_aware`` (the live router
subscribes only then); otherwise nothing is attached and a run is what it was without this
module. What the index does with them is the core's (:mod:`narwhal.core.routing.kv_index`).

Theory of operation: every engine process's block pool (:mod:`narwhal.engines.block_pool`)
gets a publisher, a new one when a crash starts a new process (its sequence restarts at 0, which
the index sees as a gap: the dead process's entries are dropped). A publisher collects the
events of ``[sim] kv_event_delay_s`` of simulated time into one batch (vLLM publishes one batch
per engine step; the delay stands for the step and the ZMQ hop) and hands it, numbered, to every
router replica's index at once. The router's block identity (:func:`sim_block_chain`) is the
simulated engines' own: a prompt's block keys read from its text or its ids
(:func:`narwhal.sim.gpu.prefix.content_keys`), so an index hit is a real simulated cache hit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import simpy

from narwhal.core.config import NarwhalConfig
from narwhal.core.policies import Policies
from narwhal.core.requests import ClientRequest
from narwhal.core.routing.kv_events import BlockHash, EventBatch, KvEvent
from narwhal.engines.block_pool import BlockPool
from narwhal.sim.gpu import wire
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.prefix import content_keys


def uses_kv_events(config: NarwhalConfig) -> bool:
    """Whether a phase is placed by ``kv_aware`` (the only reader of the events)."""
    return "kv_aware" in (config.routing.prefill, config.routing.decode)


def sim_block_chain(block_size: int) -> Callable[[ClientRequest], Sequence[BlockHash] | None]:
    """The simulated engines' block identity of a request (module docstring)."""

    def chain(request: ClientRequest) -> Sequence[BlockHash] | None:
        tokens = wire.prompt_tokens(request.body)
        return None if tokens is None else content_keys(request.body, tokens, block_size)

    return chain


class _Publisher:
    """One engine process's event stream: batches of ``delay_s``, numbered from 0."""

    def __init__(
        self,
        env: simpy.Environment,
        url: str,
        delay_s: float,
        deliver: Callable[[str, int, EventBatch], None],
    ) -> None:
        self.env = env
        self.url = url
        self.delay_s = delay_s
        self.deliver = deliver
        self.seq = 0
        self.pending: list[KvEvent] = []

    def __call__(self, event: KvEvent) -> None:
        if not self.pending:
            self.env.timeout(self.delay_s).callbacks.append(self._flush)
        self.pending.append(event)

    def _flush(self, _: Any) -> None:
        batch = EventBatch(float(self.env.now), tuple(self.pending))
        self.pending = []
        seq, self.seq = self.seq, self.seq + 1
        self.deliver(self.url, seq, batch)


def start_kv_events(
    env: simpy.Environment,
    engines: dict[str, SimEngine],
    members: list[Policies],
    delay_s: float,
) -> None:
    """Attach a publisher to every engine's pool, now and after each crash (nothing when no
    phase is ``kv_aware``)."""
    if not members or not uses_kv_events(members[0].config):
        return
    indexes = [policies.placement.kv_index for policies in members]

    def deliver(url: str, seq: int, batch: EventBatch) -> None:
        for index in indexes:
            index.apply(url, seq, batch)

    for url, engine in engines.items():

        def attach(pool: BlockPool, url: str = url) -> None:
            pool.publish = _Publisher(env, url, delay_s, deliver)

        engine.on_new_pool(attach)
