"""vLLM's KV cache events, as values, and the decoder of the messages an engine publishes.

Rule kept here: what an engine's KV event message means is decided here, once, as a pure
function of its bytes (no socket, no clock): a message this module cannot read whole is refused
with :class:`KvEventError` naming what is wrong, and nothing of it is used.

Theory of operation. vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", ...}'``) publishes each batch of cache changes as a ZMQ message of three frames: the
topic, an 8-byte big-endian sequence number, and a msgpack payload ``[ts, events]`` or ``[ts,
events, data_parallel_rank]`` (vLLM's ``EventBatch``, an array-like struct whose trailing
default is omitted). Each event is one of three, in one of two shapes:
- the positional form (vLLM releases whose events were array-like tagged structs): ``["BlockStored",
  block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]``,
  ``["BlockRemoved", block_hashes, medium, ...]``, ``["AllBlocksCleared"]``;
- the map form (vLLM 0.32, the pinned version: ``KVCacheEvent`` is a tagged, not array-like,
  struct): ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": ..., "token_ids":
  [...], "block_size": 16, "medium": "GPU", ...}`` with defaults omitted.
Fields past the ones read here (LoRA, extra keys, group, locality...) are ignored in both shapes,
so later vLLM fields do not break the reader. A block hash is bytes (vLLM's default: the
block's hash digest) or an int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``). ``medium`` None means
the GPU, as vLLM's publisher leaves it for the GPU pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

BlockHash = bytes | int
"""One block's identity as the engine reports it (vLLM's ``ExternalBlockHash``)."""

STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"


class KvEventError(ValueError):
    """A KV event message that cannot be read (the reason says what is wrong)."""


@dataclass(frozen=True)
class BlockStored:
    """The engine cached ``block_hashes`` (in prompt order, the first one's parent given)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """The engine evicted ``block_hashes``."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (a reset)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    """One published batch: when the engine made it, its events in order, its DP rank."""

    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None


@dataclass(frozen=True)
class KvEventMessage:
    """One ZMQ message of an engine's KV event stream."""

    topic: bytes
    seq: int
    batch: EventBatch


def _hashes(value: Any, where: str) -> tuple[BlockHash, ...]:
    if not isinstance(value, list):
        raise KvEventError(f"{where}: block_hashes is not a list")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, bytes | int):
            raise KvEventError(f"{where}: a block hash is neither bytes nor an int: {item!r}")
    return tuple(value)


def _parent(value: Any, where: str) -> BlockHash | None:
    if value is None or (isinstance(value, bytes | int) and not isinstance(value, bool)):
        return value
    raise KvEventError(f"{where}: parent_block_hash is neither bytes, an int nor nil")


def _medium(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise KvEventError(f"{where}: medium is not a string")


def _stored(fields: dict[str, Any], where: str) -> BlockStored:
    for name in ("block_hashes", "token_ids", "block_size"):
        if name not in fields:
            raise KvEventError(f"{where}: BlockStored without {name}")
    token_ids = fields["token_ids"]
    if not isinstance(token_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in token_ids
    ):
        raise KvEventError(f"{where}: token_ids is not a list of ints")
    size = fields["block_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise KvEventError(f"{where}: block_size is not a positive int")
    return BlockStored(
        _hashes(fields["block_hashes"], where),
        _parent(fields.get("parent_block_hash"), where),
        tuple(token_ids),
        size,
        _medium(fields.get("medium"), where),
    )


def _removed(fields: dict[str, Any], where: str) -> BlockRemoved:
    if "block_hashes" not in fields:
        raise KvEventError(f"{where}: BlockRemoved without block_hashes")
    return BlockRemoved(
        _hashes(fields["block_hashes"], where), _medium(fields.get("medium"), where)
    )


# the positional form's field order after the tag (only the fields read here)
_POSITIONAL = {
    STORED: ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    REMOVED: ("block_hashes", "medium"),
    CLEARED: (),
}


def decode_event(raw: Any, where: str = "event") -> KvEvent:
    """One event, in the positional or the map form (module docstring)."""
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str):
            raise KvEventError(f"{where}: a positional event must start with its type name")
        tag = raw[0]
        names = _POSITIONAL.get(tag)
        if names is None:
            raise KvEventError(f"{where}: unknown event type {tag!r}")
        fields = dict(zip(names, raw[1:], strict=False))
    elif isinstance(raw, dict):
        named = raw.get("type")
        if not isinstance(named, str):
            raise KvEventError(f"{where}: a map event without a string 'type'")
        tag, fields = named, raw
    else:
        raise KvEventError(f"{where}: an event is neither an array nor a map")
    if tag == STORED:
        return _stored(fields, where)
    if tag == REMOVED:
        return _removed(fields, where)
    if tag == CLEARED:
        return AllBlocksCleared()
    raise KvEventError(f"{where}: unknown event type {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """The batch of a message's msgpack payload (``[ts, events]`` or ``[ts, events, rank]``)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as error:
        raise KvEventError(f"payload is not msgpack: {error}") from None
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise KvEventError("payload is not an array [ts, events] or [ts, events, dp_rank]")
    ts, events = raw[0], raw[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvEventError("batch ts is not a number")
    if not isinstance(events, list):
        raise KvEventError("batch events is not an array")
    rank = raw[2] if len(raw) == 3 else None
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise KvEventError("batch data_parallel_rank is not an int")
    decoded = tuple(decode_event(event, f"event {i}") for i, event in enumerate(events))
    return EventBatch(float(ts), decoded, rank)


def decode_message(frames: list[bytes]) -> KvEventMessage:
    """A whole ZMQ message: topic, 8-byte big-endian sequence number, msgpack payload."""
    if len(frames) != 3:
        raise KvEventError(f"a KV event message has 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise KvEventError(f"the sequence frame is {len(seq)} bytes, not 8")
    number = int.from_bytes(seq, "big", signed=True)
    if number < 0:
        raise KvEventError(f"negative sequence number {number} (a replay's end marker)")
    return KvEventMessage(bytes(topic), number, decode_batch(payload))


def encode_batch(batch: EventBatch) -> bytes:
    """``batch`` as vLLM 0.32 publishes it (map-form events): the emulator's and the tests'
    writer, the inverse of :func:`decode_batch`."""
    events: list[Any] = []
    for event in batch.events:
        if isinstance(event, BlockStored):
            events.append(
                {
                    "type": STORED,
                    "block_hashes": list(event.block_hashes),
                    "parent_block_hash": event.parent_block_hash,
                    "token_ids": list(event.token_ids),
                    "block_size": event.block_size,
                    "lora_id": None,
                    "medium": event.medium,
                    "lora_name": None,
                }
            )
        elif isinstance(event, BlockRemoved):
            events.append(
                {"type": REMOVED, "block_hashes": list(event.block_hashes), "medium": event.medium}
            )
        else:
            events.append({"type": CLEARED})
    raw: list[Any] = [batch.ts, events]
    if batch.dp_rank is not None:
        raw.append(batch.dp_rank)
    packed: bytes = msgpack.packb(raw, use_bin_type=True)
    return packed
