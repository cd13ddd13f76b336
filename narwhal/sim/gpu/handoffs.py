"""KV handoffs between engines: a producer's leases on finished prefills, a consumer's pulls.

Rule kept here: a producer holds the blocks of a prefill it handed off until a consumer pulls
them, the router releases them, or the lease (``kv_lease_s``) runs out, whichever comes first;
a pull succeeds only if the lease was still held and had not run out when the KV arrived
(vLLM's NixlConnector: ``remote_blocks_expiry_time`` and the producer's abort timeout). A
consumer pulls only what its own prefix cache does not hold (NixlConnector: the scheduler hands
its local hit to ``get_num_new_matched_tokens``, and the worker trims the producer's block list
to the blocks the consumer still needs).

Theory of operation: :class:`Handoffs` is one producer's table of leases by remote request id,
with their expiry times in order, so expiring them (before each step is planned) looks only at
the head. The fleet's tables are found by engine id in a shared :data:`Registry` (how a
consumer finds the producer its descriptor names); an engine that crashes gets a new id and a
new table, so a pull of its old handoffs finds nothing. A consumer's :class:`KvPull` reads the
descriptor once at the start (which producer, how many KV bytes, whether a
``kv_transfer_fail`` fault makes it fail) and takes the lease when the bytes arrived.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.switches import FaultSwitches


class Lease:
    """The blocks of one handed-off prefill and when the producer stops holding them."""

    __slots__ = ("blocks", "expires")

    def __init__(self, blocks: list[int], expires: float) -> None:
        self.blocks = blocks
        self.expires = expires


class Handoffs:
    """One producer's handoffs (for one engine id: a crash starts a new table)."""

    def __init__(
        self,
        engine_id: str,
        url: str,
        index: int,
        blocks: BlockManager,
        switches: FaultSwitches,
        rng: random.Random,
        lease_s: float,
    ) -> None:
        self.engine_id = engine_id
        self.url = url
        self.side_host = f"10.0.{index // 250}.{index % 250 + 1}"  # the NIXL side channel
        self.side_port = 5600
        self.blocks = blocks
        self.switches = switches
        self.rng = rng
        self.lease_s = lease_s
        self.leases: dict[str, Lease] = {}
        self.expiry: deque[tuple[float, str]] = deque()  # (expires, remote request id), in order

    def hand_off(self, rid: str, blocks: list[int], now: float) -> tuple[str, str]:
        """Lease the blocks of request ``rid``'s finished prefill: the remote request id and the
        engine id its descriptor names (a ``release_handoff`` fault frees the blocks at once, a
        ``bad_descriptor`` fault names no engine)."""
        remote_id = f"cmpl-{rid}-0-{self.rng.getrandbits(32):08x}"
        if self.switches.has("release_handoff"):
            self.blocks.free(blocks)
        else:
            expires = now + self.lease_s
            self.leases[remote_id] = Lease(blocks, expires)
            self.expiry.append((expires, remote_id))
        engine_id = "" if self.switches.has("bad_descriptor") else self.engine_id
        return remote_id, engine_id

    def take(self, remote_id: str, now: float) -> bool:
        """A consumer finished pulling ``remote_id``: free its blocks. False if the lease is gone
        or ran out meanwhile (the blocks were the producer's to reuse, even if no step
        noticed)."""
        lease = self.leases.pop(remote_id, None)
        if lease is None:
            return False
        self.blocks.free(lease.blocks)
        return lease.expires > now

    def release(self, descriptor: dict[str, Any]) -> None:
        """The router gave up on the handoff ``descriptor`` names: free its blocks now."""
        if descriptor.get("remote_engine_id") != self.engine_id:
            return
        remote_id = descriptor.get("remote_request_id")
        lease = self.leases.pop(remote_id, None) if isinstance(remote_id, str) else None
        if lease is not None:
            self.blocks.free(lease.blocks)

    def expire(self, now: float) -> None:
        """Free the blocks of every lease that ran out by ``now``."""
        expiry = self.expiry
        while expiry and expiry[0][0] <= now:
            _, remote_id = expiry.popleft()
            lease = self.leases.get(remote_id)
            if lease is not None and lease.expires <= now:
                del self.leases[remote_id]
                self.blocks.free(lease.blocks)


Registry = dict[str, Handoffs]  # the fleet's producers' tables by engine id


class KvPull:
    """A consumer's pull of the KV a descriptor (``remote``) names."""

    __slots__ = ("engine_id", "fail", "nbytes", "remote_id", "source_url")

    def __init__(
        self,
        remote: dict[str, Any],
        prompt: int,
        kv_bytes_per_token: int,
        registry: Registry,
        switches: FaultSwitches,
        cached: int = 0,
    ) -> None:
        self.engine_id = str(remote.get("remote_engine_id"))
        producer = registry.get(self.engine_id)
        self.source_url = producer.url if producer is not None else "?"
        # only the tokens the consumer's own prefix cache does not hold (``cached``) are pulled
        tokens = int(remote.get("remote_num_tokens") or prompt) - cached
        self.nbytes = max(0, tokens) * kv_bytes_per_token
        self.fail = (  # the consumer's fault is drawn first
            switches.has("kv_transfer_fail")
            or producer is None
            or producer.switches.has("kv_transfer_fail")
        )
        self.remote_id = str(remote.get("remote_request_id"))

    def arrived(self, registry: Registry, now: float) -> bool:
        """The KV bytes arrived: take the producer's lease. False if it is gone (the producer
        released it, let it run out or crashed since)."""
        producer = registry.get(self.engine_id)
        return producer is not None and producer.take(self.remote_id, now)
