"""The emulated engine's prefix cache and its counters (vLLM's automatic prefix caching).

Rule kept here: the cache is the shared model of vLLM's block pool
(:class:`~narwhal.engines.block_pool.BlockPool`, which the simulated engine uses too); what is
the emulator's own is how it names a block's content and what it counts. A prompt's full blocks
are hashed as a chain, as vLLM hashes them (each block's hash covers the previous block's hash
and the block's tokens), so equal hashes mean equal prefixes; a lookup finds the longest cached
run from the first block, short of the prompt's last token (vLLM always computes it for its
logits); and what was looked up and found is counted under vLLM's metric names
(``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits``, in tokens). With
:meth:`PrefixCache.publish_to`, every stored and evicted block is published as vLLM's KV cache
events, one batch per insert (:mod:`narwhal.emulator.kv_publisher`).

Theory of operation: the emulator's tokenizer is one token per character after BOS
(:mod:`narwhal.emulator.text`); a prompt's token ids are cut into ``block_size`` tokens per
block and each full block hashed as vLLM 0.32 hashes it by default
(:mod:`narwhal.core.routing.block_identity`). :meth:`PrefixCache.lookup` counts
a query and its hit; :meth:`PrefixCache.insert` records a computed (or pulled) prompt's blocks:
it takes them from the pool (the cached ones touched, the others new, least recently used
cached blocks evicted when none is free) and frees them at once, last block first, so that
eviction takes a chain from its end. The emulator has no KV memory model: its pool is
``capacity`` blocks that hold only cached prompts, never a running request's KV. Disabled
(vLLM's ``--no-enable-prefix-caching``), nothing is looked up, counted or kept.
"""

from __future__ import annotations

from typing import Protocol

from narwhal.core.routing.block_identity import VllmBlockHasher
from narwhal.core.routing.kv_events import KvEvent
from narwhal.emulator.text import token_ids
from narwhal.engines.block_pool import BlockKey, BlockPool


class EventSink(Protocol):
    """Where the cache's KV events go (:class:`~narwhal.emulator.kv_publisher.KvEventPublisher`)."""

    def publish(self, event: KvEvent) -> None: ...

    def flush(self) -> None: ...


def block_hashes(text: str, block_size: int) -> list[BlockKey]:
    """The chained hashes of the full blocks of a prompt whose text is ``text``: vLLM 0.32's
    default block identity (SHA-256 of the pickled chain, fixed seed, the events' int form) of
    its token ids, so the router's index matches them as it matches a real engine's."""
    chain = VllmBlockHasher(block_size=block_size).chain(token_ids(text))
    return [int(h) for h in chain]


class PrefixCache:
    """One emulated engine's cached prompt blocks, at most ``capacity``, and its counters."""

    def __init__(self, block_size: int, capacity: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self.enabled = enabled
        self._pool = BlockPool(capacity, block_size)
        self._events: EventSink | None = None
        self.queries = 0  # prompt tokens looked up (vllm:prefix_cache_queries)
        self.hits = 0  # of them, tokens found cached (vllm:prefix_cache_hits)

    def publish_to(self, sink: EventSink) -> None:
        """Publish the cache's changes as KV events to ``sink`` (one batch per insert)."""
        self._events = sink
        self._pool.publish = sink.publish

    def __len__(self) -> int:
        return len(self._pool.block_of)

    def lookup(self, text: str, prompt_tokens: int) -> int:
        """The prompt tokens of ``text`` found cached (a multiple of the block size, less than
        ``prompt_tokens``); counted as a query and its hit."""
        if not self.enabled:
            return 0
        limit = (prompt_tokens - 1) // self.block_size
        cached = len(self._pool.match(block_hashes(text, self.block_size), limit))
        self.queries += prompt_tokens
        self.hits += cached * self.block_size
        return cached * self.block_size

    def insert(self, text: str) -> None:
        """The prompt ``text`` was computed or pulled: its blocks (as many of its first ones as
        the pool holds) are cached, most recently used, its first block most of all."""
        if not self.enabled:
            return
        pool = self._pool
        blocks: list[int] = []
        for key in block_hashes(text, self.block_size)[: self.capacity]:
            block = pool.block_of.get(key)
            if block is None:
                block = pool.take(1)[0]  # a chain holds at most every block: one is free
                pool.register([key], [block])
            else:
                pool.touch([block])
            blocks.append(block)
        pool.free(blocks)
        if self._events is not None:
            self._events.flush()

    def metric_lines(self, labels: str) -> list[str]:
        """The counters as Prometheus text, under vLLM's names."""
        return [
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number "
            "of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} {float(self.queries)}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of "
            "cached tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{labels}}} {float(self.hits)}",
        ]
