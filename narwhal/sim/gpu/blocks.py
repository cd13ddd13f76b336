"""The KV block manager: vLLM V1's ``KVCacheManager`` over the shared block pool, admitting
sequences and growing them chunk by chunk.

Rule kept here: only this manager moves a sequence's blocks between free and held, through its
:class:`~narwhal.engines.block_pool.BlockPool` (the one model of vLLM's block pool and prefix
cache, which the HTTP emulator uses too). Admission checks that the whole sequence would fit
(vLLM's ``scheduler_reserve_full_isl``) but takes only the blocks of its first chunk; later
chunks and decode growth take theirs when scheduled. A watermark (vLLM's ``--watermark``, a
fraction of the cache, 0 by default as in vLLM) is left free by admissions while anything runs;
growth may use it.

Theory of operation: the cache is ``num_blocks`` blocks of ``block_size`` tokens with real ids
(they travel in a producer's descriptor).
- A full block of a prompt with a content identity has a key
  (:data:`~narwhal.engines.block_pool.BlockKey`, read from the prompt's text by
  :mod:`narwhal.sim.gpu.prefix`). :meth:`cache` registers a sequence's computed blocks under
  their keys.
- :meth:`match` is vLLM's ``find_longest_cache_hit``. :meth:`admit` admits a sequence with
  those blocks (their reference counts rise, and a free one leaves the free queue, which counts
  against the admission like a new block) plus new blocks for its first chunk; :meth:`grow`
  adds the blocks of each later chunk or decode token.
- :meth:`free` gives a holder's blocks back to the pool and tells the engine (a waiting
  sequence may fit now).
"""

from __future__ import annotations

from collections.abc import Callable

from narwhal.engines.block_pool import BlockKey, BlockPool
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
        self.pool = BlockPool(num_blocks, block_size)
        # free blocks an admission leaves while anything runs (vLLM: int(watermark * blocks))
        self.watermark = int(watermark * num_blocks)
        self.on_free = on_free  # called after blocks came back
        # the longest prompt ever admitted: its blocks (prompt + the first output token) fit
        # an empty cache (vLLM refuses longer ones: max_model_len)
        self.max_prompt_tokens = num_blocks * block_size - 1

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def match(self, keys: list[BlockKey], limit: int) -> list[int]:
        """The blocks holding the longest cached run of ``keys`` from the first, at most
        ``limit`` of them."""
        return self.pool.match(keys, limit)

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
        size, pool = self.block_size, self.pool
        watermark = self.watermark if running else 0
        if not hit:
            if pool.num_free - reserve - watermark < -(-tokens // size):
                return False
            seq.blocks.extend(pool.take(-(-first // size)))
            return True
        needed = -(-tokens // size) - len(hit) + pool.reused_free(hit)
        if pool.num_free - reserve - watermark < needed:
            return False
        pool.touch(hit)
        seq.blocks.extend(hit)
        seq.blocks.extend(pool.take(max(0, -(-first // size) - len(hit))))
        return True

    def grow(self, seq: Seq, tokens: int) -> bool:
        """Give ``seq`` the blocks it lacks for ``tokens`` tokens (its next chunk); False, and
        nothing taken, when too few are free."""
        n = -(-tokens // self.block_size) - len(seq.blocks)
        if n <= 0:
            return True
        if self.pool.num_free < n:
            return False
        seq.blocks.extend(self.pool.take(n))
        return True

    def append_block(self, seq: Seq) -> bool:
        """Give a growing ``seq`` one more block; False when none is free."""
        block = self.pool.take_one()
        if block is None:
            return False
        seq.blocks.append(block)
        return True

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
        # blocks past the registered ones are the sequence's own new blocks: none has a key
        self.pool.register(keys[start:upto], seq.blocks[start:upto])

    def free(self, blocks: list[int]) -> None:
        """A holder lets go of ``blocks`` (see :meth:`BlockPool.free`); a waiting sequence may
        fit now."""
        self.pool.free(blocks)
        self.on_free()
