"""The KV block manager: which of an engine's KV blocks are free, and who holds the rest.

Rule kept here: a block is free or held by exactly one holder (a sequence, or a producer's
handoff after its sequence finished), and only this manager moves blocks between the two
(vLLM's ``KVCacheManager`` over its ``BlockPool``). Admission keeps a watermark of free blocks
(1% of the cache, at least one) so that running decodes can grow; growth itself may use them.

Theory of operation: the cache is ``num_blocks`` blocks of ``block_size`` tokens with real ids
(they travel in a producer's descriptor). Free ids are a stack: the most recently freed block
is the next one handed out. A sequence is admitted with the blocks its tokens need
(:meth:`allocate`), a decode asks for one more block each ``block_size`` tokens
(:meth:`append_block`), and blocks come back with :meth:`free`, which tells the engine (a
waiting sequence may fit now). Prefix caching would go here: :meth:`allocate` would first look
up blocks already holding the sequence's leading tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from narwhal.sim.gpu.sequence import Seq


class BlockManager:
    """One engine's KV blocks."""

    def __init__(self, num_blocks: int, block_size: int, on_free: Callable[[], None]) -> None:
        self.block_size = block_size
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))
        self.watermark = max(1, num_blocks // 100)  # free blocks admission leaves for growth
        self.on_free = on_free  # called after blocks came back
        # the longest prompt ever admitted: its blocks (prompt + the first output token) fit
        # beside the watermark in an empty cache (vLLM refuses longer ones: max_model_len)
        self.max_prompt_tokens = (num_blocks - self.watermark) * block_size - 1

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def allocate(self, seq: Seq, tokens: int) -> bool:
        """Give ``seq`` the blocks for ``tokens`` tokens if that leaves the watermark free."""
        free = self.free_ids
        n = -(-tokens // self.block_size)
        if len(free) - n < self.watermark:
            return False
        seq.blocks.extend(free[-n:])
        del free[-n:]
        return True

    def append_block(self, seq: Seq) -> bool:
        """Give a growing ``seq`` one more block; False when none is free."""
        if not self.free_ids:
            return False
        seq.blocks.append(self.free_ids.pop())
        return True

    def free(self, blocks: list[int]) -> None:
        self.free_ids.extend(blocks)
        self.on_free()
