"""What one simulated engine did over its whole life, crashes included (the run's per-engine
totals and the deliveries the results report)."""

from __future__ import annotations

from collections.abc import Callable


class EngineTotals:
    """Counters that outlive an engine process (a crash starts a new scheduler, not these)."""

    __slots__ = (
        "busy_s",
        "delivered",
        "on_delivered",
        "preemptions",
        "prefix_cache_hits",
        "prefix_cache_queries",
        "steps",
        "tokens_out",
    )

    def __init__(self) -> None:
        self.steps = 0  # engine iterations run
        self.busy_s = 0.0  # their total duration
        self.preemptions = 0
        self.tokens_out = 0  # tokens written to streams
        # vLLM's vllm:prefix_cache_queries / _hits: prompt tokens looked up at fresh admissions,
        # and those found in the prefix cache
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        # tokens each stream sent before its [DONE] or its fault, by request id (X-Request-Id):
        # what the client got, which an early [DONE] makes fewer than max_tokens (a resumed
        # stream's client got the sum over its legs)
        self.delivered: dict[str, int] = {}
        # when set, deliveries go here instead of into ``delivered`` (a streaming run keeps
        # them only while their request is running: narwhal.sim.streaming)
        self.on_delivered: Callable[[str, int], None] | None = None

    def deliver(self, rid: str, tokens: int) -> None:
        """The stream of ``rid`` ended cleanly after ``tokens`` tokens."""
        if self.on_delivered is not None:
            self.on_delivered(rid, tokens)
        else:
            self.delivered[rid] = tokens
