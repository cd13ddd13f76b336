"""KV blocks held by an emulated producer until a consumer pulls them, or they are released.

Rule kept here: a handoff can be pulled once, only by naming the producer's engine id, the exact
block ids and a matching prompt; a released, expired or already pulled handoff is gone. That is
what makes a bad descriptor or a released handoff really fail on the consumer.

Theory of operation: a prefill stores a :class:`KvEntry` under its ``remote_request_id`` with
freshly allocated block ids (``ceil(prompt_tokens / block_size)`` of them, one KV-cache group)
and a lease (vLLM's ``kv_lease_duration``). The consumer fetches ``GET /kv/blocks/{id}`` on the
producer's side channel (see :mod:`narwhal.emulator.handoff`); :meth:`KvStore.pull` checks it
and removes the entry. ``POST /kv/release`` and lease expiry remove entries too; expiry is swept
lazily on every access.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KvEntry:
    request_id: str
    engine_id: str
    block_ids: list[list[int]]
    num_tokens: int
    digest: str
    expires_at: float

    def as_dict(self, bytes_per_token: int) -> dict[str, Any]:
        return {
            "remote_request_id": self.request_id,
            "engine_id": self.engine_id,
            "block_ids": self.block_ids,
            "num_tokens": self.num_tokens,
            "digest": self.digest,
            "bytes": self.num_tokens * bytes_per_token,
        }


def normalize_blocks(value: object) -> list[list[int]] | None:
    """Block ids as a list of int lists (a flat list is one group); None when malformed."""
    if not isinstance(value, list):
        return None
    groups = value if all(isinstance(group, list) for group in value) else [value]
    out: list[list[int]] = []
    for group in groups:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in group):
            return None
        out.append(list(group))
    return out


@dataclass
class KvStore:
    """The producer's held handoffs."""

    engine_id: str
    block_size: int = 16
    lease_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    entries: dict[str, KvEntry] = field(default_factory=dict)
    next_block: int = 1
    pulled: int = 0
    released: int = 0
    expired: int = 0

    def put(self, request_id: str, num_tokens: int, digest: str) -> KvEntry:
        self.sweep()
        count = math.ceil(num_tokens / self.block_size)
        blocks = list(range(self.next_block, self.next_block + count))
        self.next_block += count
        entry = KvEntry(
            request_id, self.engine_id, [blocks], num_tokens, digest, self.clock() + self.lease_s
        )
        self.entries[request_id] = entry
        return entry

    def pull(self, request_id: str, engine_id: str) -> KvEntry | str:
        """Hand the entry over (and forget it), or say why not."""
        self.sweep()
        entry = self.entries.get(request_id)
        if entry is None:
            return "unknown, released or expired handoff"
        if engine_id != entry.engine_id:
            return f"engine id {engine_id!r} is not this producer's"
        del self.entries[request_id]
        self.pulled += 1
        return entry

    def release(self, request_id: str) -> bool:
        entry = self.entries.pop(request_id, None)
        if entry is not None:
            self.released += 1
        return entry is not None

    def sweep(self) -> None:
        now = self.clock()
        for request_id in [r for r, e in self.entries.items() if e.expires_at <= now]:
            del self.entries[request_id]
            self.expired += 1
