"""The KV network: transfers from producers to consumers as flows sharing a link's bandwidth.

Rule kept here: a transfer takes ``setup_s`` and then moves its bytes at a fair share of its
link's bandwidth (processor sharing: n active flows get ``bandwidth / n`` each); bytes are the
model's KV bytes per token times the tokens moved. Nothing here decides whether a transfer
*should* fail: the caller (the consumer engine) asks, and passes a flag.

Theory of operation: each link keeps its active flows with their remaining bytes and the time
of the last rate change. Adding or removing a flow first charges every flow for the bytes moved
since then, then schedules ONE SimPy timeout at the earliest completion; a generation counter
makes an older timeout a no-op. So a transfer costs two events (setup, completion) whatever the
contention. The topology maps (producer, consumer) to a link: ``per_consumer`` gives each
consumer its own ingress link (its NIC), ``shared`` puts every transfer on one fabric link.

Tensor parallelism (``ranks`` > 1): as vLLM's NixlConnector does, each rank of the consumer pulls
its own shard of the KV (its ``kv_heads / tp`` heads) from the producer's matching rank, so one
transfer is ``ranks`` flows of ``nbytes / ranks`` each, started together after one setup, each on
that rank's own link (``per_consumer``: one NIC per GPU, links ``consumer#r0``, ``consumer#r1``,
...; ``shared``: all on the fabric), and it is done when the last flow is (failed if any failed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simpy

Done = Callable[[bool], None]  # called with True when the bytes arrived, False if the flow failed


class _Flow:
    __slots__ = ("done", "fail", "remaining")

    def __init__(self, remaining: float, done: Done, fail: bool) -> None:
        self.remaining = remaining
        self.done = done
        self.fail = fail


class Link:
    """One link with processor-sharing bandwidth."""

    def __init__(self, env: simpy.Environment, bandwidth_bps: float, name: str) -> None:
        self.env = env
        self.bandwidth = bandwidth_bps
        self.name = name
        self.flows: list[_Flow] = []
        self._since = 0.0
        self._generation = 0

    def add(self, nbytes: float, done: Done, fail: bool = False) -> None:
        self._advance()
        self.flows.append(_Flow(max(nbytes, 1.0), done, fail))
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        if self.flows:
            moved = (now - self._since) * self.bandwidth / len(self.flows)
            for flow in self.flows:
                flow.remaining -= moved
        self._since = now

    def _reschedule(self) -> None:
        self._generation += 1
        if not self.flows:
            return
        smallest = min(flow.remaining for flow in self.flows)
        delay = max(0.0, smallest * len(self.flows) / self.bandwidth)
        generation = self._generation
        timer = self.env.timeout(delay)
        timer.callbacks.append(lambda _event: self._on_timer(generation))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return
        self._advance()
        eps = 1.0 + self.bandwidth * 1e-9  # a byte, or a nanosecond's worth: float rounding
        finished = [flow for flow in self.flows if flow.remaining <= eps]
        self.flows = [flow for flow in self.flows if flow.remaining > eps]
        self._reschedule()
        for flow in finished:
            flow.done(not flow.fail)


class KvNetwork:
    """Links between producers and consumers, and the transfers over them."""

    def __init__(
        self,
        env: simpy.Environment,
        *,
        bandwidth_gbps: float,
        setup_s: float,
        topology: str = "per_consumer",
        ranks: int = 1,
    ) -> None:
        self.env = env
        self.bandwidth = bandwidth_gbps * 1e9
        self.setup_s = setup_s
        self.topology = topology
        self.ranks = ranks
        self.links: dict[str, Link] = {}

    def link(self, producer: str, consumer: str, rank: int = 0) -> Link:
        if self.topology == "shared":
            key = "fabric"
        else:
            key = consumer if self.ranks == 1 else f"{consumer}#r{rank}"
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = Link(self.env, self.bandwidth, key)
        return link

    def transfer(
        self, producer: str, consumer: str, nbytes: float, done: Done, *, fail: bool = False
    ) -> None:
        """Move ``nbytes``; ``done(ok)`` runs when the last byte arrives (or the flow fails)."""
        if self.ranks > 1:
            self._transfer_sharded(producer, consumer, nbytes, done, fail)
            return
        link = self.link(producer, consumer)

        def start(_event: Any) -> None:
            link.add(nbytes, done, fail)

        timer = self.env.timeout(self.setup_s)
        timer.callbacks.append(start)

    def _transfer_sharded(
        self, producer: str, consumer: str, nbytes: float, done: Done, fail: bool
    ) -> None:
        """One flow of ``nbytes / ranks`` per rank; ``done`` once, when the last one ends."""
        ranks = self.ranks
        pending = [ranks]
        failed = [False]

        def one_done(ok: bool) -> None:
            pending[0] -= 1
            failed[0] = failed[0] or not ok
            if pending[0] == 0:
                done(not failed[0])

        def start(_event: Any) -> None:
            for rank in range(ranks):
                self.link(producer, consumer, rank).add(nbytes / ranks, one_done, fail)

        timer = self.env.timeout(self.setup_s)
        timer.callbacks.append(start)
