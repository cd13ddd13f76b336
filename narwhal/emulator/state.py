"""What an emulated engine is (:class:`EmulatorConfig`) and what it holds while it runs.

Rule kept here: the state every endpoint of one emulated engine shares — its identity, its
seeded randomness, its KV store, its prefix cache and its counters — lives in one
:class:`EngineState`, so each concern (inference, the KV handoff, the metrics and admin
endpoints) is a module of its own that is handed this state rather than a part of one large app
object.

Theory of operation: :meth:`EngineState.create` derives the engine id from the seed and the
address (one id per engine of a fleet started with one seed, the same id on every run) unless
the configuration names one. Two RNGs come from the seed: ``rng`` for request and handoff ids,
``fault_rng`` for the per-request faults' probabilities (so drawing faults never changes an id);
engines meant to fail independently are given different seeds. ``counts`` are the counters
``/admin/state`` shows (in this order) and ``/metrics`` reports under vLLM's names; ``running``
is the number of requests being served and ``running_kv_blocks`` the KV blocks they hold;
``traceparents`` the newest trace contexts received (so tests see what a router propagated).
"""

from __future__ import annotations

import random
import uuid
from collections import deque
from dataclasses import dataclass, field

from narwhal.core.config import Role
from narwhal.emulator.kv import KvStore
from narwhal.emulator.prefix_cache import PrefixCache
from narwhal.emulator.timing import LinearTiming, TimingModel

COUNTERS = (
    "requests",
    "prefills",
    "decodes",
    "pulls_ok",
    "pulls_failed",
    "recomputed",
    "aborted",
    "completed",
    "generation_tokens",
    "external_kv_tokens",
    "local_tokens",
    "kv_bytes",
)
TRACEPARENTS_KEPT = 64  # the newest W3C traceparent headers received, for /admin/state


@dataclass
class EmulatorConfig:
    """What the emulated engine is and how it behaves."""

    role: Role = Role.BOTH
    model: str = "tiny-llama"
    version: str = "0.32.0"
    host: str = "127.0.0.1"
    port: int = 0  # the HTTP port (informational: the socket is bound by the runner)
    side_channel: tuple[str, int] | None = None  # the KV side channel host, port
    engine_id: str | None = None
    block_size: int = 16
    kv_lease_s: float = 30.0
    kv_load_failure_policy: str = "fail"  # or "recompute"
    bytes_per_token: int = 2048
    max_model_len: int = 2048
    kv_cache_tokens: int = 262_144  # the KV cache /metrics reports usage of (1 GiB, 4 KiB/token)
    prefix_caching: bool = True  # vLLM's automatic prefix caching (on by default in vLLM V1)
    prefix_cache_blocks: int = 16384  # the prefix cache's bound, in blocks (LRU)
    seed: int = 0
    # vLLM's --kv-events-config: publish the prefix cache's KV events over ZMQ PUB on this
    # host (None: off; 0: a free port), with a replay ROUTER on a free port
    kv_events_port: int | None = None
    kv_events_topic: str = ""
    timing: TimingModel = field(default_factory=LinearTiming)


@dataclass
class EngineState:
    """One emulated engine's identity, randomness, KV store and counters."""

    config: EmulatorConfig
    engine_id: str
    rng: random.Random  # request ids and handoff ids
    fault_rng: random.Random  # which requests a fault with a probability strikes
    kv: KvStore
    prefix_cache: PrefixCache
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    running: int = 0
    running_kv_blocks: int = 0  # the KV blocks the requests being served hold
    # (x-request-id, traceparent) of the newest inference requests that carried a traceparent
    traceparents: deque[tuple[str, str]] = field(
        default_factory=lambda: deque(maxlen=TRACEPARENTS_KEPT)
    )

    @classmethod
    def create(cls, config: EmulatorConfig) -> EngineState:
        identity = random.Random(f"{config.seed}/{config.host}:{config.port}")  # one per engine
        engine_id = config.engine_id or str(uuid.UUID(int=identity.getrandbits(128)))
        kv = KvStore(engine_id, config.block_size, config.kv_lease_s)
        rng, fault_rng = random.Random(config.seed), random.Random(f"{config.seed}/faults")
        cache = PrefixCache(config.block_size, config.prefix_cache_blocks, config.prefix_caching)
        return cls(config, engine_id, rng, fault_rng, kv, cache)
