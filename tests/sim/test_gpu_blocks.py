"""The KV block manager: admission checks the whole sequence fits but takes its first chunk's
blocks, keeps the watermark (when set) free, growth may use it, and every block comes back
(telling the engine)."""

from __future__ import annotations

from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.sequence import Seq


def manager(
    num_blocks: int = 200, block_size: int = 16, watermark: float = 0.01
) -> tuple[BlockManager, list[int]]:
    freed: list[int] = []
    blocks = BlockManager(num_blocks, block_size, lambda: freed.append(1), watermark)
    return blocks, freed


def test_admission_takes_the_blocks_its_tokens_need_and_leaves_the_watermark() -> None:
    blocks, _ = manager(num_blocks=200)  # watermark 1%: 2 blocks
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


def test_the_watermark_applies_only_while_something_runs() -> None:
    blocks, _ = manager(num_blocks=200)  # watermark 1%: 2 blocks
    assert blocks.watermark == 2
    seq = Seq(1, "r", 0, 1)
    assert not blocks.admit(seq, 199 * 16, 16, running=True)
    assert blocks.admit(seq, 200 * 16, 16, running=False)  # an empty engine: vLLM's rule
    assert manager(watermark=0.0)[0].watermark == 0  # vLLM's default


def test_admission_checks_the_whole_sequence_and_takes_its_first_chunk() -> None:
    blocks, _ = manager(num_blocks=10, watermark=0.0)
    seq = Seq(1, "r", 150, 1)
    assert not blocks.admit(seq, 11 * 16, 32)  # 11 blocks never fit in 10
    assert seq.blocks == [] and blocks.num_free == 10
    assert blocks.admit(seq, 150, 32)  # 10 blocks would fit: takes the first chunk's 2
    assert len(seq.blocks) == 2 and blocks.num_free == 8
    assert blocks.grow(seq, 100) and len(seq.blocks) == 7  # the next chunks, when scheduled
    assert blocks.grow(seq, 100) and len(seq.blocks) == 7  # nothing lacking: nothing taken
    other = Seq(2, "o", 64, 1)
    assert blocks.admit(other, 48, 48) and blocks.num_free == 0
    assert not blocks.grow(seq, 150) and len(seq.blocks) == 7  # short: nothing taken


def test_the_longest_admissible_prompt_fits_an_empty_cache() -> None:
    blocks, _ = manager(num_blocks=8, block_size=16, watermark=0.0)
    assert blocks.max_prompt_tokens == 8 * 16 - 1
    assert blocks.allocate(Seq(1, "r", 0, 1), blocks.max_prompt_tokens + 1)  # + first token
    blocks2, _ = manager(num_blocks=8, block_size=16, watermark=0.0)
    assert not blocks2.allocate(Seq(1, "r", 0, 1), blocks.max_prompt_tokens + 2)


# ---------------------------------------------------------------------- prefix caching


def keyed(sid: int, tokens: int, keys: list[int]) -> Seq:
    """A sequence of ``tokens`` prompt tokens whose full blocks have ``keys``."""
    seq = Seq(sid, f"r{sid}", tokens, 1)
    seq.keys = keys
    return seq


def admit(blocks: BlockManager, seq: Seq, limit: int | None = None) -> list[int]:
    """Admit ``seq`` with its cached prefix and register all its full blocks; the hit."""
    keys = seq.keys or []
    hit = blocks.match(keys, len(keys) if limit is None else limit)
    assert blocks.allocate(seq, seq.prompt + 1, hit)
    seq.registered = len(hit)
    blocks.cache(seq, len(keys))
    return hit


def test_a_prefix_is_matched_block_for_block_up_to_the_first_miss_and_the_limit() -> None:
    blocks, _ = manager(num_blocks=100)
    first = keyed(1, 64, [10, 11, 12, 13])  # 4 full blocks + the sampled token's block
    assert admit(blocks, first) == []
    assert len(first.blocks) == 5
    assert blocks.match([10, 11, 12, 13], 4) == first.blocks[:4]
    assert blocks.match([10, 11, 99, 13], 4) == first.blocks[:2]  # a chain stops at a miss
    assert blocks.match([10, 11, 12, 13], 3) == first.blocks[:3]  # vLLM: short of the last token
    assert blocks.match([99, 11], 2) == []
    second = keyed(2, 64, [10, 11, 77, 78])
    assert admit(blocks, second) == first.blocks[:2]  # shares its first two blocks
    assert second.blocks[:2] == first.blocks[:2] and not set(second.blocks[2:]) & set(first.blocks)
    assert [blocks.pool.refs[b] for b in first.blocks[:2]] == [2, 2]  # held by both


def test_a_freed_cached_block_stays_reusable_until_evicted_lru_tail_first() -> None:
    blocks, freed = manager(num_blocks=12, block_size=16)  # watermark 1
    old = keyed(1, 48, [1, 2, 3])  # 3 keyed blocks + 1 plain (the sampled token's)
    admit(blocks, old)
    held = list(old.blocks)
    blocks.free(old.blocks)
    assert freed == [1] and blocks.num_free == 12
    # the plain block went back on the stack, the keyed ones into the LRU queue, last block first
    assert list(blocks.pool.evictable) == [held[2], held[1], held[0]]
    assert blocks.match([1, 2, 3], 3) == held[:3]  # still a hit while free
    # 9 free blocks hold nothing cached (8 never used, the plain one): taking 9 evicts nothing
    filler = Seq(2, "f", 0, 1)
    assert blocks.allocate(filler, 9 * 16)
    assert blocks.match([1, 2, 3], 3) == held[:3] and blocks.num_free == 3
    # one more block evicts exactly the least recently freed one: the prefix's tail
    assert blocks.append_block(filler)
    assert filler.blocks[-1] == held[2]
    assert blocks.match([1, 2, 3], 3) == held[:2] and list(blocks.pool.evictable) == held[1::-1]


def test_a_hit_on_a_free_block_takes_it_out_of_the_free_queue_and_counts_at_admission() -> None:
    blocks, _ = manager(num_blocks=10, block_size=16)  # watermark 1
    cached = keyed(1, 64, [5, 6, 7, 8])
    admit(blocks, cached)
    blocks.free(cached.blocks)
    assert blocks.num_free == 10 and len(blocks.pool.evictable) == 4
    again = keyed(2, 64, [5, 6, 7, 8])
    hit = blocks.match(again.keys or [], 3)
    assert len(hit) == 3
    # 5 blocks: 3 reused (free ones: they count) + 2 new; 10 - 5 leaves more than the watermark
    assert blocks.allocate(again, 65, hit)
    assert again.blocks[:3] == hit and blocks.num_free == 5
    assert not set(hit) & set(blocks.pool.evictable)  # no longer evictable: held
    assert all(blocks.pool.refs[b] == 1 for b in hit)
    big = keyed(3, 64, [5, 6, 7, 8])
    hit = blocks.match(big.keys or [], 4)  # the 4th block is still free: reusing it counts
    assert not blocks.allocate(big, 16 * 9, hit)  # 9 blocks: 3 held + 1 free + 5 new > 5 - 1
    assert blocks.pool.refs[hit[3]] == 0 and big.blocks == []  # refused: nothing changed


def test_the_same_content_computed_twice_keeps_the_first_block_cached() -> None:
    blocks, _ = manager(num_blocks=40)
    first, second = keyed(1, 32, [1, 2]), keyed(2, 32, [1, 2])
    assert blocks.allocate(first, 33) and blocks.allocate(second, 33)  # both missed
    first.registered = second.registered = 0
    blocks.cache(first, 2)
    blocks.cache(second, 2)
    assert blocks.match([1, 2], 2) == first.blocks[:2]
    blocks.free(second.blocks)  # its copies were never cached: back on the stack
    assert not blocks.pool.evictable and blocks.match([1, 2], 2) == first.blocks[:2]
    blocks.free(first.blocks)
    assert list(blocks.pool.evictable) == first.blocks[1::-1]


def test_without_cached_blocks_every_path_is_the_plain_stack() -> None:
    blocks, _ = manager(num_blocks=50)
    plain = Seq(1, "p", 40, 1)  # no keys: content no other request shares
    assert blocks.allocate(plain, 41, blocks.match([], 0))
    blocks.cache(plain, 3)
    assert not blocks.pool.block_of and not blocks.pool.evictable
    ids = list(plain.blocks)
    blocks.free(plain.blocks)
    assert blocks.pool.free_ids[-3:] == ids  # pushed in order: the last one is handed out first
