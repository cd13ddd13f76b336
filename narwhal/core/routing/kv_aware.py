"""The ``kv_aware`` policy: one cost per engine from the blocks its own KV events say it holds
and the requests it is serving.

Rule kept here: the cost of placing a prompt on an engine is stated once, here::

    cost = overlap_weight x (prompt blocks - blocks the engine holds of the prompt's prefix)
         + load_weight x reservations of the phase on the engine

and the lowest cost wins (ties broken by the seeded RNG); with ``temperature > 0`` the engine is
drawn with probability proportional to ``exp(-cost / temperature)`` (Dynamo's softmax), by the
placement's seeded RNG. Every placement leaves speculative entries for the prompt's blocks on
the chosen engine (:meth:`~narwhal.core.routing.kv_index.KvIndex.speculate`), so the next request
sharing the prefix sees them before the engine's events arrive.

Theory of operation: the index (:class:`~narwhal.core.routing.kv_index.KvIndex`, one per
router, in :class:`~narwhal.core.placement.Placement`) is fed by the drivers with each engine's
KV events. A prompt's block chain comes from the *block identity* the router was built with
(:data:`BlockChain`): the function that computes, from a client request, the block hashes the
engines compute for it. It must be the engines' own scheme, or no hash ever matches: the
simulator gives its simulated engines' scheme; the live router gives vLLM's, computed from the
token ids a request carries (:mod:`narwhal.core.routing.block_identity`); a router built
without one refuses ``kv_aware``. A request without a chain (None: no request, or content with
no identity, such as a text prompt live) is placed on load alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from narwhal.core.config import ConfigError, KvAwareSettings, RoutingSettings
from narwhal.core.requests import ClientRequest
from narwhal.core.routing.kv_events import BlockHash
from narwhal.core.routing.kv_index import KvIndex
from narwhal.core.routing.policy import Counts, RoutingPolicy

BlockChain = Callable[[ClientRequest], Sequence[BlockHash] | None]
"""A request's full prompt blocks as the engines hash them, in order (None: no identity)."""


def kv_aware_phases(routing: RoutingSettings) -> list[str]:
    """The phases ``routing`` places with ``kv_aware``."""
    return [phase for phase in ("prefill", "decode") if getattr(routing, phase) == "kv_aware"]


def unavailable(phase: str) -> ConfigError:
    """The refusal of ``kv_aware`` for ``phase`` on a router without a block identity."""
    return ConfigError(
        f"routing.{phase} = 'kv_aware' needs the engines' block identity, which this router "
        "was not given (the simulator and narwhal serve give one); use prefix_affinity"
    )


class KvAware(RoutingPolicy):
    """Cached blocks against load, one cost (module docstring)."""

    name = "kv_aware"

    def __init__(
        self,
        phase: str,
        counts: Counts,
        rng: random.Random,
        index: KvIndex,
        chain_of: BlockChain | None,
        settings: KvAwareSettings,
    ) -> None:
        super().__init__(phase, counts, rng)
        if chain_of is None:
            raise unavailable(phase)
        self.index = index
        self._chain_of = chain_of
        self._overlap_weight = settings.overlap_weight
        self._load_weight = settings.load_weight
        self._temperature = settings.temperature
        self.held_blocks = 0  # blocks of placed prompts their engine held (a hit count)
        self.prompt_blocks = 0  # blocks of placed prompts

    def costs(
        self, candidates: list[str], chain: Sequence[BlockHash], now: float
    ) -> list[tuple[float, int]]:
        """Each candidate's cost and the blocks of ``chain`` it holds, in candidate order."""
        index, counts, phase = self.index, self._counts, self.phase
        out: list[tuple[float, int]] = []
        blocks = len(chain)
        for url in candidates:
            held = index.overlap(url, chain, now) if blocks else 0
            cost = self._overlap_weight * (blocks - held) + self._load_weight * counts[url][phase]
            out.append((cost, held))
        return out

    def held_tokens(self, candidates: list[str], request: ClientRequest, now: float) -> int:
        """The prompt tokens the candidate this policy would choose holds (no side effects, no
        draw: the lowest cost, the first among equals), by that engine's block size as its
        events report it (0 while it has reported none)."""
        chain = self._chain_of(request)
        if not chain or not candidates:
            return 0
        scored = self.costs(candidates, chain, now)
        pick = min(range(len(scored)), key=lambda i: scored[i][0])
        size = self.index.block_size(candidates[pick])
        return 0 if size is None else scored[pick][1] * size

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        chain = self._chain_of(request) if request is not None else None
        scored = self.costs(candidates, chain or (), now)
        if self._temperature > 0 and len(candidates) > 1:
            pick = self._softmax([cost for cost, _ in scored])
        else:
            least = min(cost for cost, _ in scored)
            tied = [i for i, (cost, _) in enumerate(scored) if cost == least]
            pick = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        chosen = candidates[pick]
        if chain:
            self.prompt_blocks += len(chain)
            self.held_blocks += scored[pick][1]
            self.index.placed_on_estimate(chosen)
            self.index.speculate(chosen, chain, now)
        return chosen

    def _softmax(self, costs: list[float]) -> int:
        least = min(costs)
        weights = [math.exp(-(cost - least) / self._temperature) for cost in costs]
        draw = self._rng.random() * sum(weights)
        for i, weight in enumerate(weights):
            draw -= weight
            if draw < 0:
                return i
        return len(weights) - 1

    def placed(self, url: str, request: ClientRequest | None, now: float) -> None:
        chain = self._chain_of(request) if request is not None else None
        if chain:
            self.index.speculate(url, chain, now)
