"""vLLM's KV block pool with automatic prefix caching, modelled once for every emulated engine.

Rule kept here: this is the one model of an engine's prefix cache; the simulated engine's block
manager (:mod:`narwhal.sim.gpu.blocks`) and the HTTP emulator's cache
(:mod:`narwhal.emulator.prefix_cache`) are built on it and differ only in how they name a
block's content (a *key*) and in what they keep beside it. A block is free or held; a block
that holds no cached content has exactly one holder, a cached block has a reference count
(every holder whose prefix it is), and only this pool moves blocks between free and held
(vLLM's ``BlockPool``). Pure: no I/O, no clock, no randomness.

Theory of operation: the pool is ``num_blocks`` blocks with real ids (they travel in a
producer's descriptor).
- A full block of a prompt has a key (an int) that stands for its tokens and everything before
  them, as vLLM's chained block hash does; two prompts' keys agree block for block exactly as
  far as their content does. :meth:`register` records a holder's computed blocks under their
  keys; a key already registered keeps its first block (the later one stays uncached).
- :meth:`match` is vLLM's ``find_longest_cache_hit``: the blocks holding the longest run of a
  prompt's leading keys, at most ``limit`` of them (vLLM always computes the prompt's last
  token, so callers pass a limit short of it). :meth:`touch` takes hit blocks for a new holder:
  their reference counts rise and a free one leaves the free queue.
- Free blocks are two queues, as vLLM's ``free_blocks`` orders its one queue: blocks holding
  nothing reusable are a stack (the most recently freed is handed out first: vLLM prepends
  them), cached blocks whose count dropped to 0 wait in least-recently-freed order
  (:attr:`evictable`; vLLM appends them) and stay reusable until evicted. :meth:`take` hands out
  blocks from the stack first, then from the head of the evictable queue (evicting its key).
  :meth:`free` takes a holder's blocks back last block first, so a prefix's tail is evicted
  before its head and what the pool holds of any prefix is a prefix of it.
- With no cached block at all (prefix caching off, or prompts whose content has no key) every
  path is the plain stack.
- KV cache events (vLLM's ``--kv-events-config``): when :attr:`publish` is set, each
  :meth:`register` that caches new keys publishes one ``BlockStored`` of them (in order; the
  key is the block hash, the parent and token ids are left empty, as the router's index reads
  neither) and each eviction by :meth:`take` one ``BlockRemoved`` of the evicted keys, as
  vLLM's block pool does; a new pool is a new engine process, whose publisher starts a new
  sequence (the router's index sees the restart as a gap and drops the old entries).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from itertools import islice

from narwhal.core.routing.kv_events import BlockRemoved, BlockStored, KvEvent

BlockKey = int  # stands for a full block's tokens and everything before them


class BlockPool:
    """One engine's KV blocks: the free ones, and the cached ones by key."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        self.block_size = block_size  # tokens per block (only the events carry it)
        # where the pool's KV cache events go (None: vLLM without --kv-events-config)
        self.publish: Callable[[KvEvent], None] | None = None
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))  # holding nothing cached
        self.block_of: dict[BlockKey, int] = {}  # the cached blocks by key
        # by block id: its key (None: not cached) and, while cached, its holders (0: free)
        self.key_of: list[BlockKey | None] = [None] * num_blocks
        self.refs = [0] * num_blocks
        self.evictable: OrderedDict[int, None] = OrderedDict()  # free cached blocks, LRU first

    @property
    def num_free(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    def match(self, keys: list[BlockKey], limit: int) -> list[int]:
        """The blocks holding the longest cached run of ``keys`` from the first, at most
        ``limit`` of them."""
        block_of = self.block_of
        hit: list[int] = []
        for key in keys[:limit]:
            block = block_of.get(key)
            if block is None:
                break
            hit.append(block)
        return hit

    def reused_free(self, hit: list[int]) -> int:
        """How many of the cached ``hit`` blocks are free (taking them counts like a new
        block)."""
        refs = self.refs
        return sum(1 for block in hit if refs[block] == 0)

    def touch(self, hit: list[int]) -> None:
        """A new holder takes the cached ``hit`` blocks (vLLM's ``touch``): a free one leaves
        the free queue."""
        refs, evictable = self.refs, self.evictable
        for block in hit:
            count = refs[block]
            if count == 0:
                del evictable[block]
            refs[block] = count + 1

    def take(self, n: int) -> list[int]:
        """``n`` free blocks: from the stack, then evicted from the head of the LRU queue
        (the caller checked that there are enough)."""
        free = self.free_ids
        k = min(n, len(free))
        taken = free[len(free) - k :]
        del free[len(free) - k :]
        if k < n:
            evictable, key_of, block_of = self.evictable, self.key_of, self.block_of
            victims = list(islice(evictable, n - k))  # the least recently freed
            evicted: list[BlockKey] = []
            for block in victims:
                del evictable[block]
                key = key_of[block]
                if key is not None:  # (always: only cached blocks are evictable)
                    del block_of[key]
                    evicted.append(key)
                key_of[block] = None
            taken.extend(victims)
            if self.publish is not None and evicted:
                self.publish(BlockRemoved(tuple(evicted)))
        return taken

    def take_one(self) -> int | None:
        """One free block (as :meth:`take`), or None when none is free."""
        if self.free_ids:
            return self.free_ids.pop()
        if not self.evictable:
            return None
        return self.take(1)[0]

    def register(self, keys: list[BlockKey], blocks: list[int]) -> None:
        """A holder computed ``blocks`` (or is scheduled to, as vLLM caches them), uncached
        ones holding the content of ``keys``: cache each under its key unless the key is cached
        already (in another block: then this one stays the holder's own)."""
        block_of, key_of, refs = self.block_of, self.key_of, self.refs
        stored: list[BlockKey] | None = [] if self.publish is not None else None
        for key, block in zip(keys, blocks, strict=True):
            if key in block_of:
                continue
            block_of[key] = block
            key_of[block] = key
            refs[block] = 1
            if stored is not None:
                stored.append(key)
        if stored and self.publish is not None:
            self.publish(BlockStored(tuple(stored), None, (), self.block_size))

    def free(self, blocks: list[int]) -> None:
        """A holder lets go of ``blocks``: uncached ones go back on the stack, cached ones lose
        a reference and, at none left, join the tail of the LRU queue (last block first)."""
        if not self.block_of:
            self.free_ids.extend(blocks)
            return
        key_of, refs, evictable = self.key_of, self.refs, self.evictable
        plain: list[int] = []
        for block in reversed(blocks):
            if key_of[block] is None:
                plain.append(block)
            else:
                count = refs[block] - 1
                refs[block] = count
                if count == 0:
                    evictable[block] = None
        plain.reverse()
        self.free_ids.extend(plain)
