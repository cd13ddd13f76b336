"""The KV block manager: which of an engine's KV blocks are free, who holds the rest, and which
hold a cached prefix (vLLM V1's automatic prefix caching).

Rule kept here: a block is free or held; a block that holds no cached content has exactly one
holder (a sequence, or a producer's handoff after its sequence finished), a cached block has a
reference count (every sequence or handoff whose prefix it is), and only this manager moves
blocks between free and held (vLLM's ``KVCacheManager`` over its ``BlockPool``). Admission
checks that the whole sequence would fit (vLLM's ``scheduler_reserve_full_isl``) but takes only
the blocks of its first chunk; later chunks and decode growth take theirs when scheduled. A
watermark (vLLM's ``--watermark``, a fraction of the cache, 0 by default as in vLLM) is left free
by admissions while anything runs; growth may use it.

Theory of operation: the cache is ``num_blocks`` blocks of ``block_size`` tokens with real ids
(they travel in a producer's descriptor).
- A full block of a prompt with a content identity has a *key*
  (:data:`~narwhal.sim.gpu.prefix.BlockKey`) that stands for its tokens and everything before
  them, as vLLM's chained block hash does. :meth:`cache` registers a sequence's computed blocks
  under their keys; a key already registered keeps its first block (the later one stays
  uncached).
- :meth:`match` is vLLM's ``find_longest_cache_hit``: the blocks holding the longest run of a
  sequence's leading keys, at most ``limit`` of them. :meth:`admit` admits a sequence with
  those blocks (their reference counts rise, and a free one leaves the free queue, which counts
  against the admission like a new block) plus new blocks for its first chunk; :meth:`grow`
  adds the blocks of each later chunk or decode token.
- Free blocks are two queues, as vLLM's ``free_blocks`` orders its one queue: blocks holding
  nothing reusable are a stack (the most recently freed is handed out first: vLLM prepends
  them), cached blocks whose count dropped to 0 wait in least-recently-freed order
  (:attr:`evictable`; vLLM appends them) and stay reusable until evicted. New blocks come from
  the stack first, then from the head of the evictable queue (evicting its key). A sequence's
  blocks are freed last block first, so a prefix's tail is evicted before its head.
- :meth:`free` tells the engine (a waiting sequence may fit now). With no cached block at all
  (prefix caching off, or prompts without identity) every path is the plain stack.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from itertools import islice

from narwhal.sim.gpu.prefix import BlockKey
from narwhal.sim.gpu.sequence import Seq


class BlockManager:
    """One engine's KV blocks and its prefix cache."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        on_free: Callable[[], None],
        watermark: float = 0.0,
    ) -> None:
        self.block_size = block_size
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))  # holding nothing cached
        # free blocks an admission leaves while anything runs (vLLM: int(watermark * blocks))
        self.watermark = int(watermark * num_blocks)
        self.on_free = on_free  # called after blocks came back
        # the longest prompt ever admitted: its blocks (prompt + the first output token) fit
        # an empty cache (vLLM refuses longer ones: max_model_len)
        self.max_prompt_tokens = num_blocks * block_size - 1
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

    def allocate(self, seq: Seq, tokens: int, hit: list[int] | None = None) -> bool:
        """Give ``seq`` the blocks for ``tokens`` tokens at once (a handoff's, a whole
        admission): :meth:`admit` with its first chunk the whole sequence."""
        return self.admit(seq, tokens, tokens, hit)

    def admit(
        self,
        seq: Seq,
        tokens: int,
        first: int,
        hit: list[int] | None = None,
        reserve: int = 0,
        running: bool = True,
    ) -> bool:
        """Admit ``seq`` if blocks for all its ``tokens`` tokens would fit beside ``reserve``
        blocks (and the watermark, while anything is ``running``), and give it the cached
        ``hit`` blocks (from :meth:`match`) plus new blocks up to its ``first`` tokens."""
        size = self.block_size
        watermark = self.watermark if running else 0
        if not hit:
            if self.num_free - reserve - watermark < -(-tokens // size):
                return False
            n = -(-first // size)
            free = self.free_ids
            if len(free) >= n:
                seq.blocks.extend(free[-n:])
                del free[-n:]
            else:
                seq.blocks.extend(self._take(n))
            return True
        refs = self.refs
        reused_free = sum(1 for block in hit if refs[block] == 0)
        needed = -(-tokens // size) - len(hit) + reused_free
        if self.num_free - reserve - watermark < needed:
            return False
        evictable = self.evictable
        for block in hit:  # vLLM's touch: a free cached block leaves the free queue
            count = refs[block]
            if count == 0:
                del evictable[block]
            refs[block] = count + 1
        seq.blocks.extend(hit)
        seq.blocks.extend(self._take(max(0, -(-first // size) - len(hit))))
        return True

    def grow(self, seq: Seq, tokens: int) -> bool:
        """Give ``seq`` the blocks it lacks for ``tokens`` tokens (its next chunk); False, and
        nothing taken, when too few are free."""
        n = -(-tokens // self.block_size) - len(seq.blocks)
        if n <= 0:
            return True
        if self.num_free < n:
            return False
        seq.blocks.extend(self._take(n))
        return True

    def append_block(self, seq: Seq) -> bool:
        """Give a growing ``seq`` one more block; False when none is free."""
        if self.free_ids:
            seq.blocks.append(self.free_ids.pop())
            return True
        if not self.evictable:
            return False
        seq.blocks.extend(self._take(1))
        return True

    def _take(self, n: int) -> list[int]:
        """``n`` free blocks: from the stack, then evicted from the head of the LRU queue
        (the caller checked that there are enough)."""
        free = self.free_ids
        k = min(n, len(free))
        taken = free[len(free) - k :]
        del free[len(free) - k :]
        if k < n:
            evictable, key_of, block_of = self.evictable, self.key_of, self.block_of
            victims = list(islice(evictable, n - k))  # the least recently freed
            for block in victims:
                del evictable[block]
                key = key_of[block]
                if key is not None:  # (always: only cached blocks are evictable)
                    del block_of[key]
                key_of[block] = None
            taken.extend(victims)
        return taken

    def cache(self, seq: Seq, upto: int) -> None:
        """``seq``'s first ``upto`` blocks are computed (or scheduled to be, as vLLM caches
        them): register those of them that have a key and are not registered yet."""
        keys = seq.keys
        if keys is None:
            return
        upto = min(upto, len(keys))
        start = seq.registered
        if upto <= start:
            return
        seq.registered = upto
        block_of, key_of, refs = self.block_of, self.key_of, self.refs
        # blocks past the registered ones are the sequence's own new blocks: none has a key
        for key, block in zip(keys[start:upto], seq.blocks[start:upto], strict=True):
            if key in block_of:
                continue  # the same content is cached already (in another block): not this one
            block_of[key] = block
            key_of[block] = key
            refs[block] = 1

    def free(self, blocks: list[int]) -> None:
        """A holder lets go of ``blocks``: uncached ones go back on the stack, cached ones lose
        a reference and, at none left, join the tail of the LRU queue (last block first)."""
        if not self.block_of:
            self.free_ids.extend(blocks)
        else:
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
        self.on_free()
