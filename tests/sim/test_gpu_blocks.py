"""The KV block manager: admission keeps the watermark free, growth may use it, and every block
comes back (telling the engine)."""

from __future__ import annotations

from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.sequence import Seq


def manager(num_blocks: int = 200, block_size: int = 16) -> tuple[BlockManager, list[int]]:
    freed: list[int] = []
    blocks = BlockManager(num_blocks, block_size, on_free=lambda: freed.append(1))
    return blocks, freed


def test_admission_takes_the_blocks_its_tokens_need_and_leaves_the_watermark() -> None:
    blocks, _ = manager(num_blocks=200)  # watermark: 2 blocks
    seq = Seq(1, "r", 100, 4)
    assert blocks.allocate(seq, 101)  # ceil(101 / 16) = 7 blocks
    assert len(seq.blocks) == 7 and blocks.num_free == 193
    assert sorted(seq.blocks) == list(range(7))  # the lowest ids first
    big = Seq(2, "r2", 0, 1)
    assert not blocks.allocate(big, 192 * 16)  # 192 blocks would leave 1 < 2 free
    assert big.blocks == [] and blocks.num_free == 193
    assert blocks.allocate(big, 191 * 16)  # 191 leave exactly the watermark
    assert blocks.num_free == 2


def test_growth_may_use_the_watermark_until_none_is_free() -> None:
    blocks, _ = manager(num_blocks=100)  # watermark: 1 block
    seq = Seq(1, "r", 0, 1)
    assert blocks.allocate(seq, 99 * 16)
    assert blocks.append_block(seq)  # the watermark block
    assert not blocks.append_block(seq)
    assert len(seq.blocks) == 100 and len(set(seq.blocks)) == 100


def test_freed_blocks_are_reused_first_and_the_engine_is_told() -> None:
    blocks, freed = manager()
    first, second = Seq(1, "a", 0, 1), Seq(2, "b", 0, 1)
    blocks.allocate(first, 32)
    held = list(first.blocks)
    blocks.free(first.blocks)
    assert freed == [1] and blocks.num_free == 200
    blocks.allocate(second, 32)
    assert sorted(second.blocks) == sorted(held)


def test_the_longest_admissible_prompt_fits_an_empty_cache_beside_the_watermark() -> None:
    blocks, _ = manager(num_blocks=8, block_size=16)  # watermark 1: 7 blocks for a sequence
    assert blocks.max_prompt_tokens == 7 * 16 - 1
    assert blocks.allocate(Seq(1, "r", 0, 1), blocks.max_prompt_tokens + 1)  # + first token
    blocks2, _ = manager(num_blocks=8, block_size=16)
    assert not blocks2.allocate(Seq(1, "r", 0, 1), blocks.max_prompt_tokens + 2)
