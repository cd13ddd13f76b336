"""The KV block index: which blocks each engine holds, as its own KV cache events say.

Rule kept here: what the router believes an engine's prefix cache holds is kept here, once, for
every policy and both worlds, bounded in memory, and never more than the engine said plus what
the router itself just sent it (speculative entries, each expiring). An engine whose event stream
skipped a batch has its reported entries dropped at once (a missed ``BlockRemoved`` would make
them claim blocks the engine no longer holds) and is *approximate* until its stream is whole
again: the policies then see only the router's own speculative entries for it, never an
engine's stale claims. Pure: callers pass ``now``; nothing here reads a clock or does I/O.

Theory of operation. A driver hands each decoded batch (:mod:`narwhal.core.routing.kv_events`)
of an engine to :meth:`KvIndex.apply` with its sequence number. ``BlockStored`` adds the
block hashes (GPU medium only: ``medium`` None or ``"GPU"``), ``BlockRemoved`` drops them,
``AllBlocksCleared`` empties the engine. A sequence number that is not the last one plus one
is a gap: the engine's reported entries are dropped, it is marked approximate (counted in
:attr:`KvIndex.gaps`), and the batch itself is applied (its events are real). A driver that can
replay (vLLM's replay socket) asks :meth:`KvIndex.expected` before applying a batch and, on a
gap, applies the replayed batches first, so no gap is seen. After a drop the reported entries
rebuild from later events and are a subset of what the engine holds (an eviction of a block
the index never had changes nothing), so they stay usable; *approximate* says the engine may
hold more than the index knows, until ``AllBlocksCleared`` (a known-empty cache). The first
batch seen from an engine starts its sequence. An engine whose stream is down is marked with
:meth:`KvIndex.stream_down` (approximate, entries dropped, its next batch starts a sequence);
meanwhile only the router's own speculative entries speak for it, the approximate estimate.

Bounds: at most ``max_blocks_per_engine`` reported entries per engine (the oldest stored go
first) and ``max_blocks_total`` over all engines (the engine holding the most loses its oldest);
every entry dropped for a bound is counted in :attr:`KvIndex.bounded_out`. A block hash costs
about 100 bytes here (a bytes digest of 32 bytes and its dict slot), so the default total of
4 M entries is about 400 MB at most: an engine's GPU cache is typically 10^4 - 10^5 blocks.

Speculative entries: :meth:`KvIndex.speculate` records the blocks of a prompt just placed on
an engine, expiring ``speculative_ttl_s`` later; an entry the engine then reports stored is
confirmed (it moves to the reported set). They stand in for the engine's cache between the
placement and the engine's events, so two requests with the same prefix a few milliseconds
apart go to the same engine.

:meth:`KvIndex.overlap` is the number of leading blocks of a prompt's block chain the engine
holds (reported, or speculative and unexpired), as vLLM's prefix cache matches a prompt: a run
from the first block, stopping at the first block it does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from narwhal.core.routing.kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
)

GPU = "GPU"


@dataclass
class _EngineBlocks:
    """One engine's entries: reported (insertion ordered, oldest first) and speculative."""

    reported: dict[BlockHash, None] = field(default_factory=dict)
    speculative: dict[BlockHash, float] = field(default_factory=dict)  # hash -> expiry
    last_seq: int | None = None
    approximate: bool = False
    batches: int = 0
    block_size: int | None = None  # tokens per block, as its BlockStored events say
    gaps: int = 0  # sequence gaps seen in its stream
    on_estimate: int = 0  # placements on it while its stream had delivered nothing


class KvIndex:
    """Per-engine block hash sets fed by KV events (module docstring)."""

    def __init__(
        self,
        *,
        max_blocks_per_engine: int = 1_000_000,
        max_blocks_total: int = 4_000_000,
        speculative_ttl_s: float = 2.0,
    ) -> None:
        if max_blocks_per_engine <= 0 or max_blocks_total <= 0:
            raise ValueError("the KV index bounds must be positive")
        if speculative_ttl_s < 0:
            raise ValueError("speculative_ttl_s must be at least 0")
        self.max_blocks_per_engine = max_blocks_per_engine
        self.max_blocks_total = max_blocks_total
        self.speculative_ttl_s = speculative_ttl_s
        self._engines: dict[str, _EngineBlocks] = {}
        self.total = 0  # reported entries over all engines
        self.gaps = 0  # sequence gaps seen (each dropped an engine's entries)
        self.bounded_out = 0  # entries dropped to keep the bounds
        self.refused_batches = 0  # messages a driver could not decode (:meth:`refused`)

    def _engine(self, url: str) -> _EngineBlocks:
        blocks = self._engines.get(url)
        if blocks is None:
            blocks = self._engines[url] = _EngineBlocks()
        return blocks

    # ---------------------------------------------------------------- the engine's events

    def apply(self, url: str, seq: int, batch: EventBatch) -> None:
        """``url``'s batch number ``seq``: a gap first drops its entries (module docstring)."""
        engine = self._engine(url)
        if engine.last_seq is not None and seq != engine.last_seq + 1:
            self.gaps += 1
            engine.gaps += 1
            self._drop(engine)
            engine.approximate = True
        engine.last_seq = seq
        engine.batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.medium in (None, GPU):
                    engine.block_size = event.block_size
                    self._store(url, engine, event.block_hashes)
            elif isinstance(event, BlockRemoved):
                if event.medium in (None, GPU):
                    for block in event.block_hashes:
                        if block in engine.reported:
                            del engine.reported[block]
                            self.total -= 1
            elif isinstance(event, AllBlocksCleared):
                self._drop(engine)
                engine.speculative.clear()
                engine.approximate = False

    def _store(self, url: str, engine: _EngineBlocks, hashes: Iterable[BlockHash]) -> None:
        reported, speculative = engine.reported, engine.speculative
        for block in hashes:
            speculative.pop(block, None)  # confirmed
            if block in reported:
                continue
            reported[block] = None
            self.total += 1
            if len(reported) > self.max_blocks_per_engine:
                self._drop_oldest(engine)
            if self.total > self.max_blocks_total:
                largest = max(self._engines.values(), key=lambda e: len(e.reported))
                self._drop_oldest(largest)

    def _drop_oldest(self, engine: _EngineBlocks) -> None:
        oldest = next(iter(engine.reported))
        del engine.reported[oldest]
        self.total -= 1
        self.bounded_out += 1

    def _drop(self, engine: _EngineBlocks) -> None:
        self.total -= len(engine.reported)
        engine.reported.clear()

    def expected(self, url: str) -> int | None:
        """The sequence number ``url``'s next batch must have (None: any starts a sequence)."""
        engine = self._engines.get(url)
        return None if engine is None or engine.last_seq is None else engine.last_seq + 1

    def stream_down(self, url: str) -> None:
        """``url``'s event stream is down: its reported entries go, it is approximate, and its
        next batch starts a new sequence."""
        engine = self._engine(url)
        self._drop(engine)
        engine.approximate = True
        engine.last_seq = None

    def refused(self, url: str) -> None:
        """A message of ``url``'s stream could not be decoded: its events are lost, as in a
        gap whose size is unknown (counted; the stream starts a new sequence)."""
        self.refused_batches += 1
        self.stream_down(url)

    def forget(self, url: str) -> None:
        """``url`` left the fleet."""
        engine = self._engines.pop(url, None)
        if engine is not None:
            self.total -= len(engine.reported)

    # ---------------------------------------------------------------- the router's placements

    def speculate(self, url: str, chain: Sequence[BlockHash], now: float) -> None:
        """The prompt whose block chain is ``chain`` was just placed on ``url``."""
        if self.speculative_ttl_s == 0 or not chain:
            return
        engine = self._engine(url)
        until = now + self.speculative_ttl_s
        speculative = engine.speculative
        for block in chain:
            if block not in engine.reported:
                speculative[block] = until
        if len(speculative) > self.max_blocks_per_engine:
            self._expire(engine, now)

    def _expire(self, engine: _EngineBlocks, now: float) -> None:
        speculative = engine.speculative
        for block in [b for b, until in speculative.items() if until <= now]:
            del speculative[block]
        while len(speculative) > self.max_blocks_per_engine:
            del speculative[next(iter(speculative))]
            self.bounded_out += 1

    def placed_on_estimate(self, url: str) -> bool:
        """A prompt with a block chain was just placed on ``url``: whether that placement
        rested on the estimate alone, the router's speculative entries (no batch of ``url``'s
        applied since its stream started or last went down), counted per engine
        (``/status``)."""
        engine = self._engine(url)
        estimated = engine.last_seq is None
        if estimated:
            engine.on_estimate += 1
        return estimated

    # ---------------------------------------------------------------- reads

    def overlap(self, url: str, chain: Sequence[BlockHash], now: float) -> int:
        """How many leading blocks of ``chain`` ``url`` holds (module docstring)."""
        engine = self._engines.get(url)
        if engine is None:
            return 0
        reported, speculative = engine.reported, engine.speculative
        held = 0
        for block in chain:
            if block in reported:
                held += 1
                continue
            until = speculative.get(block)
            if until is None or until <= now:
                break
            held += 1
        return held

    def approximate(self, url: str) -> bool:
        """Whether ``url``'s reported entries are not trusted now (a gap or a stream down)."""
        engine = self._engines.get(url)
        return engine is not None and engine.approximate

    def last_seq(self, url: str) -> int | None:
        """The sequence number of ``url``'s latest batch applied (None: none since its stream
        (re)started)."""
        engine = self._engines.get(url)
        return None if engine is None else engine.last_seq

    def engine_gaps(self, url: str) -> int:
        """Sequence gaps seen in ``url``'s stream."""
        engine = self._engines.get(url)
        return 0 if engine is None else engine.gaps

    def estimated_placements(self, url: str) -> int:
        """Placements on ``url`` that rested on the estimate (:meth:`placed_on_estimate`)."""
        engine = self._engines.get(url)
        return 0 if engine is None else engine.on_estimate

    def block_size(self, url: str) -> int | None:
        """Tokens per block of ``url``, as its latest ``BlockStored`` said (None: none yet)."""
        engine = self._engines.get(url)
        return None if engine is None else engine.block_size

    def blocks(self, url: str) -> int:
        """Reported entries held for ``url``."""
        engine = self._engines.get(url)
        return 0 if engine is None else len(engine.reported)

    def reported(self, url: str) -> frozenset[BlockHash]:
        """``url``'s reported entries (a copy: tests and ``/status`` read it)."""
        engine = self._engines.get(url)
        return frozenset() if engine is None else frozenset(engine.reported)
