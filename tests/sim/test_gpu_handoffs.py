"""Handoffs: a producer holds a prefill's blocks until they are pulled, released or the lease
runs out; a pull takes them only while the lease holds, and a crashed producer's are gone."""

from __future__ import annotations

import random

from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.handoffs import Handoffs, KvPull, Registry
from narwhal.sim.gpu.sequence import Seq
from narwhal.sim.gpu.switches import FaultSwitches


def producer(registry: Registry, engine_id: str = "e1") -> tuple[Handoffs, BlockManager]:
    blocks = BlockManager(100, 16, on_free=lambda: None)
    switches = FaultSwitches(random.Random(1))
    handoffs = Handoffs(engine_id, "http://p", 0, blocks, switches, random.Random(2), 10.0)
    registry[engine_id] = handoffs
    return handoffs, blocks


def prefilled(blocks: BlockManager) -> list[int]:
    seq = Seq(1, "r", 40, 1)
    blocks.allocate(seq, 41)
    return seq.blocks


def descriptor(remote_id: str, engine_id: str) -> dict[str, object]:
    return {"remote_engine_id": engine_id, "remote_request_id": remote_id, "remote_num_tokens": 40}


def test_a_pull_within_the_lease_takes_the_blocks_once() -> None:
    registry: Registry = {}
    handoffs, blocks = producer(registry)
    remote_id, engine_id = handoffs.hand_off("r", prefilled(blocks), now=0.0)
    assert remote_id.startswith("cmpl-r-0-") and len(remote_id) == len("cmpl-r-0-") + 8
    assert engine_id == "e1" and blocks.num_free == 97
    consumer = FaultSwitches(random.Random(3))
    pull = KvPull(descriptor(remote_id, engine_id), 40, 1000, registry, consumer)
    assert pull.source_url == "http://p" and pull.nbytes == 40_000 and not pull.fail
    assert pull.arrived(registry, now=5.0)
    assert blocks.num_free == 100
    assert not pull.arrived(registry, now=5.0)  # nothing left to take


def test_a_lease_that_ran_out_frees_the_blocks_and_fails_the_pull() -> None:
    registry: Registry = {}
    handoffs, blocks = producer(registry)
    remote_id, engine_id = handoffs.hand_off("r", prefilled(blocks), now=0.0)
    pull = KvPull(descriptor(remote_id, engine_id), 40, 1, registry, FaultSwitches(random.Random()))
    assert not pull.arrived(registry, now=10.5)  # arrived after the lease: no step expired it
    assert blocks.num_free == 100  # the blocks were the producer's again all the same
    remote_id, _ = handoffs.hand_off("r", prefilled(blocks), now=20.0)
    handoffs.expire(now=29.9)
    assert remote_id in handoffs.leases
    handoffs.expire(now=30.0)
    assert not handoffs.leases and blocks.num_free == 100


def test_release_frees_only_a_handoff_of_this_engine_id() -> None:
    registry: Registry = {}
    handoffs, blocks = producer(registry)
    remote_id, _ = handoffs.hand_off("r", prefilled(blocks), now=0.0)
    handoffs.release({"remote_engine_id": "other", "remote_request_id": remote_id})
    assert blocks.num_free == 97
    handoffs.release({"remote_engine_id": "e1", "remote_request_id": remote_id})
    assert blocks.num_free == 100 and not handoffs.leases


def test_a_crashed_producer_has_a_new_id_and_its_old_handoffs_cannot_be_pulled() -> None:
    registry: Registry = {}
    handoffs, blocks = producer(registry, "old")
    remote_id, engine_id = handoffs.hand_off("r", prefilled(blocks), now=0.0)
    pull = KvPull(descriptor(remote_id, engine_id), 40, 1, registry, FaultSwitches(random.Random()))
    del registry["old"]  # the crash: a new process registers under a new id
    producer(registry, "new")
    assert not pull.arrived(registry, now=1.0)


def test_producer_faults_release_at_once_or_name_no_engine() -> None:
    registry: Registry = {}
    handoffs, blocks = producer(registry)
    handoffs.switches.request_faults.append(("release_handoff", 1.0, 0))
    handoffs.switches.request_faults.append(("bad_descriptor", 1.0, 0))
    remote_id, engine_id = handoffs.hand_off("r", prefilled(blocks), now=0.0)
    assert engine_id == "" and not handoffs.leases and blocks.num_free == 100
    pull = KvPull(descriptor(remote_id, engine_id), 40, 1, registry, FaultSwitches(random.Random()))
    assert pull.fail and pull.source_url == "?"  # no producer by that id
