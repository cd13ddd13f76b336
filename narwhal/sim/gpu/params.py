"""What one simulated engine is: the vLLM serving flags the simulator models.

Rule kept here: these are engine settings only (the router's settings live in
:mod:`narwhal.core.config`); the scenario's ``[fleet]`` table makes one value for every engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineParams:
    """One simulated engine's settings (from the scenario's ``[fleet]``)."""

    model: str
    max_num_seqs: int = 256  # vLLM --max-num-seqs: the sequence cap
    max_num_batched_tokens: int = 2048  # vLLM --max-num-batched-tokens: the step's token budget
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 50_000  # KV blocks in the cache
    step_overhead_s: float = 0.002  # host work added to every step's modelled time
    step_overhead_per_seq_s: float = 0.0  # host work per sequence the step schedules
    step_overhead_per_token_s: float = 0.0  # host work per token the step schedules
    jitter: float = 0.05  # each step is multiplied by uniform(1 - jitter, 1 + jitter)
    straggler_rate: float = 0.0  # the chance that a step is a straggler
    straggler_factor: float = 1.0  # a straggler step takes this many times as long
    stream_interval: int = 1  # tokens per streamed chunk (vLLM --stream-interval)
    kv_lease_s: float = 30.0  # how long a producer holds a finished prefill's blocks
    kv_load_failure_policy: str = "fail"  # "fail" | "recompute" (vLLM's flag of that name)
    coalesce_reads: bool = True  # plain token chunks wait for the router's next wake-up
    prefix_caching: bool = True  # vLLM --enable-prefix-caching (on by default in vLLM V1)
    async_scheduling: bool = False  # vLLM --async-scheduling: step N+1 planned while N runs
