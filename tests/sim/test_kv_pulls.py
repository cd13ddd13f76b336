"""The scheduler's rules for a decode leg that pulls its KV (vLLM 0.32's
``WAITING_FOR_REMOTE_KVS``), at their exact boundaries: a pull starts only while the running
list is below ``max_num_seqs`` and the budget is not spent, pulls in flight are outside the cap,
its blocks leave room for what the running prefills still need, and once its KV arrived it waits
for room in the batch and is scheduled ahead of new work for one token; an aborted or failed
pull gives back what it held.

One consumer engine is driven directly (real SimPy, the real scheduler); a producer's
:class:`~narwhal.sim.gpu.handoffs.Handoffs` in the registry holds the leases the pulls take. The
scheduler's ``plan`` is observed (the real one runs, and the record reads what it did): per
step, each sequence's state before and after it, the decode batch and prefill chunks it planned,
the free blocks and each sequence's blocks after it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import simpy

from narwhal.core.ports import StreamOpened
from narwhal.core.wire import DONE
from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.handoffs import Handoffs, Registry
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.sequence import PREFILL, PULLED, TRANSFER, WAITING, Seq, SeqState, SimStream
from narwhal.sim.gpu.switches import FaultSwitches
from narwhal.sim.gpu.wire import ERROR_500
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.timing import step_model
from tests.compiled_stage import EXPECT_COMPILED

# The harness observes the scheduler by wrapping its ``plan`` on the instance, which a mypyc
# class refuses; the compiled build's scheduling is held to the pure build's by the
# byte-identical ``narwhal simulate`` check of the compiled stage.
pytestmark = pytest.mark.skipif(
    EXPECT_COMPILED,
    reason="wraps Scheduler.plan on the instance, which a compiled class does not allow",
)

URL = "http://sim-d"
PRODUCER = "producer-engine"


@dataclass
class Row:
    """What one planned step did."""

    step: int
    at: float
    before: dict[str, SeqState]  # each sequence's state when the step was planned
    running: int  # the running list (decoding + prefilling) when the step was planned
    decoding: list[str]  # the decode batch it runs (one token each)
    chunks: dict[str, int]  # its prefill chunks
    free: int  # free blocks after planning it
    after: dict[str, SeqState]  # each sequence's state once it was planned
    blocks: dict[str, list[int]]  # each sequence's KV blocks once it was planned

    @property
    def tokens(self) -> int:
        return len(self.decoding) + sum(self.chunks.values())


class Consumer:
    """A consumer engine, a producer's handoffs to pull from, and a record of every step."""

    def __init__(self, pull_s: float, **params: Any) -> None:
        self.env = simpy.Environment()
        # a pull takes its setup time (the link is fast enough that the bytes take ~nothing)
        net = KvNetwork(self.env, bandwidth_gbps=1e6, setup_s=pull_s)
        registry: Registry = {}
        producer_blocks = BlockManager(10_000, 16, on_free=lambda: None)
        self.producer = Handoffs(
            PRODUCER,
            "http://sim-p",
            1,
            producer_blocks,
            FaultSwitches(random.Random(7)),
            random.Random(8),
            lease_s=600.0,
        )
        registry[PRODUCER] = self.producer
        settings = {"model": "llama3-8b", "jitter": 0.0, "prefix_caching": False, **params}
        self.engine = SimEngine(
            self.env,
            URL,
            0,
            EngineParams(**settings),
            step_model("llama3-8b"),
            net,
            registry,
            random.Random(1),
        )
        self.streams: dict[str, SimStream] = {}
        self.seqs: dict[str, Seq] = {}
        self.rows: list[Row] = []
        scheduler = self.engine.scheduler
        real_plan = scheduler.plan

        def plan(step: int, now: float) -> Any:
            before = {seq.rid: seq.state for seq in self.seqs.values()}
            running = len(scheduler.decoding) + len(scheduler.prefilling)
            planned = real_plan(step, now)
            if planned is not None:
                self.rows.append(
                    Row(
                        step,
                        now,
                        before,
                        running,
                        [seq.rid for seq in scheduler.decoding],
                        {seq.rid: take for seq, take in planned[1]},
                        scheduler.blocks.num_free,
                        {seq.rid: seq.state for seq in self.seqs.values()},
                        {seq.rid: list(seq.blocks) for seq in self.seqs.values()},
                    )
                )
            return planned

        scheduler.plan = plan  # type: ignore[method-assign]

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run ``action`` at simulated time ``t``."""
        self.env.timeout(t).callbacks.append(lambda _event: action())

    def local(self, t: float, rid: str, prompt: int, out: int) -> None:
        """A plain streamed request of ``prompt`` tokens arrives at ``t``."""
        self.at(t, lambda: self._open(rid, prompt, out, None))

    def pull(self, t: float, rid: str, prompt: int, out: int) -> None:
        """A decode leg of a prompt the producer prefilled arrives at ``t``."""

        self.at(t, lambda: self._open(rid, prompt, out, self.descriptor(rid, prompt)))

    def descriptor(self, rid: str, prompt: int) -> dict[str, Any]:
        """The producer prefilled ``prompt`` tokens for ``rid`` now: the descriptor to pull."""
        held = Seq(0, rid, prompt, 1)
        assert self.producer.blocks.allocate(held, prompt + 1)
        remote_id, engine_id = self.producer.hand_off(rid, held.blocks, self.env.now)
        return {
            "do_remote_prefill": True,
            "remote_engine_id": engine_id,
            "remote_request_id": remote_id,
            "remote_num_tokens": prompt,
        }

    def _open(self, rid: str, prompt: int, out: int, params: dict[str, Any] | None) -> None:
        body: dict[str, Any] = {"prompt": [10] * prompt, "max_tokens": out, "stream": True}
        if params is not None:
            body["kv_transfer_params"] = params
        opened = self.engine.open_stream("/v1/completions", body, {"X-Request-Id": rid})
        assert isinstance(opened, StreamOpened) and isinstance(opened.handle, SimStream)
        self.streams[rid] = opened.handle
        assert opened.handle.seq is not None
        self.seqs[rid] = opened.handle.seq

    def run(self, until: float = 30.0) -> None:
        self.env.run(until=until)

    def decode_steps(self, rid: str) -> list[int]:
        return [row.step for row in self.rows if rid in row.decoding]

    def chunk_steps(self, rid: str) -> dict[int, int]:
        return {row.step: row.chunks[rid] for row in self.rows if rid in row.chunks}

    def row(self, step: int) -> Row:
        (row,) = [row for row in self.rows if row.step == step]
        return row

    def first_in(self, rid: str, state: SeqState) -> int:
        """The first step planned while ``rid`` was in ``state``."""
        return min(row.step for row in self.rows if row.before.get(rid) is state)

    def started(self, rid: str) -> int:
        """The step whose planning started ``rid``'s pull."""
        return min(
            row.step
            for row in self.rows
            if row.after.get(rid) is TRANSFER and row.before.get(rid) is WAITING
        )

    def delivered(self, rid: str) -> int:
        """The tokens ``rid``'s stream carried, to its end."""
        stream = self.streams[rid]
        assert stream.chunks[-1] == DONE, f"{rid} did not end"
        return self.engine.totals.delivered[rid]


@pytest.mark.parametrize("running_at_start", [1, 2])
def test_a_pull_starts_only_below_the_cap_and_pulls_in_flight_are_outside_it(
    running_at_start: int,
) -> None:
    # max_num_seqs = 2. Below the cap every pull starts at once, however many are already in
    # flight (five here), and a local request is still admitted beside them; at the cap
    # (running == 2) none starts until a running sequence has finished.
    c = Consumer(pull_s=5.0, max_num_seqs=2)
    c.local(0.0, "a", prompt=20, out=40)
    if running_at_start == 2:
        c.local(0.0, "b", prompt=20, out=400)
    for i in range(5):
        c.pull(0.05, f"p{i}", prompt=30, out=4)
    c.local(0.1, "late", prompt=20, out=4)
    c.run(until=4.0)  # every pull still in flight
    a_last = c.decode_steps("a")[-1]
    if running_at_start == 1:
        starts = {c.started(f"p{i}") for i in range(5)}
        (start,) = starts  # all five started in one step...
        assert c.row(start).running == 1  # ...planned with one sequence running
        assert c.engine.load()["transferring"] == 5 and c.engine.params.max_num_seqs == 2
        late = c.chunk_steps("late")  # admitted with five pulls in flight, below the cap
        assert c.row(min(late)).running == 1 and min(late) < a_last
    else:
        at_cap = [row for row in c.rows if row.step <= a_last and row.at >= 0.05]
        assert at_cap and all(row.running == 2 for row in at_cap)
        assert all(row.before.get("p0") is WAITING for row in at_cap[1:])
        # the step after "a" finished (running 1 < 2) starts them all: they do not fill it
        assert all(c.started(f"p{i}") == a_last + 1 for i in range(5))
        assert c.row(a_last + 1).before["p0"] is WAITING and c.row(a_last + 1).running == 1
        assert min(c.chunk_steps("late")) == a_last + 1  # and the local one took the seat
        assert c.engine.load()["transferring"] == 5


def test_an_arrived_pull_waits_at_the_cap_then_joins_ahead_of_earlier_waiting_work() -> None:
    c = Consumer(pull_s=0.2, max_num_seqs=2)
    c.pull(0.0, "p", prompt=100, out=10)  # starts at step 0 (nothing runs yet)
    c.local(0.0, "a", prompt=20, out=60)
    c.local(0.01, "b", prompt=20, out=200)  # running == 2 from here on
    c.local(0.1, "w", prompt=50, out=5)  # waits for a seat, before p's KV arrived
    c.run()
    arrived = c.first_in("p", PULLED)
    a_last = c.decode_steps("a")[-1]
    w_first = min(c.chunk_steps("w"))
    assert c.first_in("w", WAITING) < arrived < a_last  # w waited longer than p
    assert all(c.row(s).running == 2 for s in range(arrived, a_last + 1))
    assert all(c.row(s).before["p"] is PULLED for s in range(arrived, a_last + 2))
    # a seat frees when "a" finishes: p takes it at the next step, w waits for the next seat
    assert c.decode_steps("p")[0] == a_last + 1
    assert c.row(a_last + 1).before["w"] is WAITING and "w" not in c.row(a_last + 1).chunks
    assert w_first == c.decode_steps("p")[-1] + 1  # p finished before b did
    assert c.delivered("p") == 10 and c.delivered("w") == 5


@pytest.mark.parametrize("last_chunk", [62, 63])
def test_a_pulled_decode_joins_only_with_budget_left_and_takes_one_token(last_chunk: int) -> None:
    # Budget 64. "d" decodes (1 token a step); "x" prefills 63 tokens a step, so the budget is
    # spent while p's KV is already there. x's last chunk leaves 64 - 1 - last_chunk tokens: one
    # (p joins in that very step, taking it: y, waiting behind, gets nothing) or none (p joins at
    # the next step). Either way y's first chunk is the 64 tokens less the three decodes.
    c = Consumer(pull_s=0.04, max_num_batched_tokens=64)
    c.local(0.0, "d", prompt=10, out=500)
    c.pull(0.0, "p", prompt=40, out=30)
    c.local(0.015, "x", prompt=63 * 12 + last_chunk, out=500)
    c.local(0.016, "y", prompt=300, out=2)
    c.run(until=3.0)
    x_chunks = c.chunk_steps("x")
    x_last = max(x_chunks)
    assert set(list(x_chunks.values())[:-1]) == {63} and x_chunks[x_last] == last_chunk
    assert min(x_chunks) < c.first_in("p", PULLED) < x_last  # p waited, with its KV, for budget
    p_first = c.decode_steps("p")[0]
    assert p_first == (x_last if last_chunk == 62 else x_last + 1)
    assert c.row(p_first).tokens == 64  # the budget, to the token
    y_first = min(c.chunk_steps("y"))
    assert y_first == x_last + 1
    assert c.chunk_steps("y")[y_first] == 64 - 3  # d, x and p decode, one token each
    # p's first step recomputed its last prompt token and sampled its first: 30 steps in all
    assert c.decode_steps("p") == list(range(p_first, p_first + 30))
    assert c.delivered("p") == 30


@pytest.mark.parametrize(("pull_blocks", "admitted_at_once"), [(30, True), (31, False)])
def test_a_pull_is_admitted_only_if_its_whole_prompt_fits_and_blocks_the_queue_if_not(
    pull_blocks: int, admitted_at_once: bool
) -> None:
    # 50 blocks of 16. "r" (320 tokens: 20 blocks, out = 1) is prefilled whole in step 0, which
    # leaves 30 free for the pull behind it: at 30 blocks it is admitted in the same step, at 31
    # it is refused and the one-block request behind it waits too (first come, first served),
    # until r finished at the end of step 0 and both are admitted at step 1.
    c = Consumer(pull_s=0.05, num_blocks=50, block_size=16, max_num_batched_tokens=512)
    c.local(0.0, "r", prompt=320, out=1)
    c.pull(0.0, "p", prompt=pull_blocks * 16, out=1)  # one decode step: no block to grow
    c.local(0.0, "z", prompt=16, out=1)
    c.run()
    assert c.chunk_steps("r") == {0: 320}
    admitted = c.started("p")
    if admitted_at_once:
        assert admitted == 0 and c.row(0).free == 0  # (z waits for r's blocks either way)
    else:
        assert c.row(0).free == 30 and "z" not in c.row(0).chunks
        assert admitted == 1
    assert c.chunk_steps("z") == {1: 16}
    assert c.engine.totals.preemptions == 0
    assert c.delivered("p") == 1 and c.delivered("r") == 1 and c.delivered("z") == 1
    assert c.engine.load()["free_blocks"] == 50


def test_a_pull_leaves_free_the_blocks_a_running_prefill_still_needs() -> None:
    # vLLM's _inflight_prefill_reserved_blocks. A running prefill short of blocks while budget
    # is left is a state the simulated scheduler does not reach by itself: a prefill it chunks
    # has spent the budget, and with budget left every running prefill got its last chunk's
    # blocks, so the reserve is 0 whenever a pull is considered. vLLM reaches it through limits
    # the simulator does not model (long_prefill_token_threshold, encoder budgets). So the state
    # is set up by hand and the real admission runs on it: "r", 320 tokens (20 blocks of 16),
    # holds the 5 blocks of its first 80; of 50 blocks 45 are free and 15 are r's to come.
    c = Consumer(pull_s=1.0, num_blocks=50, block_size=16)
    scheduler, blocks = c.engine.scheduler, c.engine.scheduler.blocks
    r = Seq(100, "r", 320, 10)
    assert blocks.admit(r, 320, 80)
    r.state, r.prefilled = PREFILL, 80
    scheduler.prefilling.append(r)
    assert blocks.num_free == 45 and scheduler._prefill_reserve() == 15

    def offer(rid: str, pull_blocks: int) -> Seq:
        seq = Seq(101 + len(c.seqs), rid, pull_blocks * 16, 1)
        seq.need, seq.remote = 0, c.descriptor(rid, seq.prompt)
        c.seqs[rid] = seq
        scheduler.waiting.append(seq)
        assert scheduler._admit(scheduler.it, 100, []) == 100  # a pull takes no budget
        if seq.state is WAITING:
            scheduler.waiting.clear()
        return seq

    assert offer("p31", 31).state is WAITING and blocks.num_free == 45  # 31 free, not beside r
    assert offer("p30", 30).state is TRANSFER and blocks.num_free == 15  # fits exactly
    assert offer("p1", 1).state is WAITING  # 15 free, all r's
    assert scheduler.transferring == 1
    assert blocks.grow(r, 320) and blocks.num_free == 0  # r still gets every block it needs
    assert scheduler._prefill_reserve() == 0


def test_a_pull_aborted_after_its_kv_arrived_frees_its_blocks_at_once_and_takes_no_seat() -> None:
    # max_num_seqs = 1: "a" runs, p's KV arrives and p waits for the seat; the router gives up
    # on p meanwhile. Its blocks come back at the abort, and when a finishes the seat and the
    # whole budget go to "w", which waited behind p.
    c = Consumer(pull_s=0.05, max_num_seqs=1, max_num_batched_tokens=64)
    c.pull(0.0, "p", prompt=160, out=5)  # starts at step 0, before a takes the seat
    c.local(0.0, "a", prompt=20, out=60)
    c.local(0.01, "w", prompt=200, out=2)
    free_at_abort: list[int] = []

    def abort() -> None:
        assert c.seqs["p"].state is PULLED
        before = c.engine.scheduler.blocks.num_free
        c.engine.close_stream(c.streams["p"])
        free_at_abort.append(c.engine.scheduler.blocks.num_free - before)

    c.at(0.2, abort)
    c.run()
    assert free_at_abort == [10]  # p's 160 tokens' blocks, freed by the abort itself
    assert c.streams["p"].ended is not None and c.decode_steps("p") == []
    a_last = c.decode_steps("a")[-1]
    assert c.row(a_last).at > 0.2
    assert c.chunk_steps("w") == {a_last + 1: 64, a_last + 2: 64, a_last + 3: 64, a_last + 4: 8}
    assert c.engine.load()["transferring"] == 0
    assert c.engine.load()["free_blocks"] == c.engine.params.num_blocks


def test_a_pull_aborted_in_flight_is_not_joined_when_its_kv_lands() -> None:
    c = Consumer(pull_s=0.1)
    c.pull(0.0, "p", prompt=160, out=5)
    c.local(0.0, "a", prompt=20, out=60)
    c.at(0.05, lambda: c.engine.close_stream(c.streams["p"]))
    c.run()
    assert c.engine.load()["transferring"] == 0 and c.decode_steps("p") == []
    assert c.delivered("a") == 60
    assert c.engine.load()["free_blocks"] == c.engine.params.num_blocks
    assert c.producer.leases  # never taken: the producer's lease runs out (or the router frees it)


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_failed_pull_follows_the_kv_load_failure_policy(policy: str) -> None:
    # The consumer's pulls fail. "fail": the stream gets vLLM's in-band error and ends, the
    # blocks come back. "recompute": it prefills its whole prompt locally, with the blocks it
    # was admitted with (none more are taken), from the step after the failure, and then
    # streams every token.
    c = Consumer(pull_s=0.05, kv_load_failure_policy=policy, max_num_batched_tokens=64)
    c.engine.switches.request_faults.append(("kv_transfer_fail", 1.0, 0))
    c.local(0.0, "a", prompt=20, out=60)
    c.pull(0.0, "p", prompt=160, out=5)
    held: list[list[int]] = []  # p's blocks while its KV was on the way
    c.at(0.04, lambda: held.append(list(c.seqs["p"].blocks)))
    c.run()
    assert c.engine.load()["transferring"] == 0 and c.delivered("a") == 60
    assert c.engine.load()["free_blocks"] == c.engine.params.num_blocks
    data = b"".join(c.streams["p"].chunks)
    if policy == "fail":
        assert ERROR_500 in data and data.endswith(DONE) and b'"text"' not in data
        assert not c.chunk_steps("p") and not c.decode_steps("p")
    else:
        assert ERROR_500 not in data and c.delivered("p") == 5
        chunks = c.chunk_steps("p")
        assert sum(chunks.values()) == 160  # the whole prompt, recomputed
        first = min(chunks)
        assert c.row(first - 1).at < 0.05 + 1e-9 <= c.row(first).at  # at once after the failure
        assert len(held[0]) == 10 and all(c.row(step).blocks["p"] == held[0] for step in chunks)
        assert c.decode_steps("p") == list(range(max(chunks) + 1, max(chunks) + 5))
