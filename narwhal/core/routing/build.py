"""A routing policy from its configured name (``[routing] prefill`` / ``decode``).

Rule kept here: every name of :data:`~narwhal.core.config.RoutingPolicyName` builds exactly one
policy class, whose ``name`` is that name; the configuration refuses any other name before a
router is built.
"""

from __future__ import annotations

import random

from narwhal.core.config import RoutingSettings
from narwhal.core.routing.kv_aware import BlockChain, KvAware
from narwhal.core.routing.kv_index import KvIndex
from narwhal.core.routing.load import LeastLoaded, LoadReports
from narwhal.core.routing.policy import (
    Counts,
    LeastReserved,
    PowerOfTwo,
    RandomChoice,
    RoundRobin,
    RoutingPolicy,
)
from narwhal.core.routing.prefix import PrefixAffinity


def build_policy(
    name: str,
    phase: str,
    *,
    serving: list[str],
    counts: Counts,
    rng: random.Random,
    reports: LoadReports,
    settings: RoutingSettings,
    kv_index: KvIndex | None = None,
    block_chain: BlockChain | None = None,
) -> RoutingPolicy:
    """The policy called ``name`` placing ``phase`` over the engines ``serving`` it."""
    if name == "least_reserved":
        return LeastReserved(phase, counts, rng)
    if name == "round_robin":
        return RoundRobin(phase, counts, rng, serving)
    if name == "random":
        return RandomChoice(phase, counts, rng)
    if name == "power_of_two":
        return PowerOfTwo(phase, counts, rng)
    if name == "least_loaded":
        return LeastLoaded(phase, counts, rng, reports, settings.least_loaded)
    if name == "prefix_affinity":
        return PrefixAffinity(phase, counts, rng, serving, settings.prefix_affinity)
    if name == "kv_aware":
        index = kv_index if kv_index is not None else KvIndex()
        return KvAware(phase, counts, rng, index, block_chain, settings.kv_aware)
    raise ValueError(f"unknown routing policy {name!r}")
