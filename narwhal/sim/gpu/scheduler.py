"""The scheduler: which sequences each engine step runs, and what a step did to them.

Rule kept here: vLLM's continuous batching, as its v1 scheduler (0.32) does it, step for step
(``tests/parity/test_scheduler_parity.py`` checks it against the real engine). Every running
decode is scheduled first (one token each), then the running prefills' next chunks, then, in a
step that preempted nothing, the waiting queues: pulled decodes, then waiting sequences first
come first served, while the sequence cap (``max_num_seqs``: the running list, which pulls in
flight are not in) and the token budget (``max_num_batched_tokens``) allow. An admission needs
the whole sequence to fit in the free blocks but takes only its first chunk's; later chunks and
decode tokens take theirs when scheduled. When one is short, the tail of the running list (the
last admitted: a running prefill, else the decode that joined last) is preempted (recompute
preemption): its blocks are freed and it goes back to the head of the queue to prefill its
prompt plus the tokens it already generated.

Theory of operation:
- :meth:`Scheduler.plan` composes step ``s``: its prefill chunks (decodes are implied) and its
  duration: the :class:`~narwhal.sim.timing.StepTiming`'s, plus the host overhead, times the
  seeded noise (both :class:`~narwhal.sim.gpu.stepcost.StepCost`) and the slow-down switch.
  :meth:`Scheduler.apply` then applies it when the step ends: prefill progress, tokens,
  outputs, finishes.
- Per-token work is avoided: a decode that joins the batch at step ``j`` with context ``c0``
  has context ``c0 + (s - j)`` at step ``s``, so the batch's total context is one running sum
  (``ctx_base + len(decoding) * s``), and the steps at which a sequence needs a block, must
  emit output (every ``stream_interval`` tokens) or finishes are filed in buckets keyed by step
  number. A step costs O(1) plus the sequences that have something due at it. The decodes
  that emitted at a step and stay in the batch are due again ``stream_interval`` steps later:
  their entries (unchanged: same sequence, same ``run``) go there as one list, so at one token
  per chunk a decode's chunk costs one append, not a new entry filed in the table.
- A bucket entry carries the sequence's ``run``; a sequence that left the batch since has a new
  ``run``, and its old entries are skipped. The longest decode context (what a skewed batch's
  attention pays for) is the top of a heap of ``c0 - j`` kept the same way: entries of
  sequences that left are dropped when they reach the top.
- A decode leg whose KV lives on a producer is admitted with blocks for its prompt (beside
  the blocks running prefills still need) and first pulls the KV
  (:class:`~narwhal.sim.gpu.handoffs.KvPull` over the :class:`~narwhal.sim.kvnet.KvNetwork`);
  once it arrived it waits in ``pulled`` for room in the batch, then decodes. A finished
  prefill leg hands its blocks off (:class:`~narwhal.sim.gpu.handoffs.Handoffs`) and its
  reply is the descriptor.
- Prefix caching, as vLLM V1 does it: admission first looks up the longest cached prefix of the
  sequence's block keys (short of its last token, whose logits must be computed) and takes
  those blocks without computing them; the prefill starts after them (``prefilled`` counts
  them, so its attention still covers them), and a remote decode pulls only the tokens after
  them (NixlConnector's ``get_num_new_matched_tokens``). The blocks a step computes are cached
  when it is planned (vLLM caches them when it schedules them), a pulled prompt's when its KV
  arrived. Every fresh admission counts vLLM's ``prefix_cache_queries`` (its tokens) and
  ``prefix_cache_hits`` (those found cached); a preempted sequence's re-admission does not.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable

import simpy

from narwhal.core.ports import Reply
from narwhal.sim.gpu import wire
from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.handoffs import Handoffs, KvPull, Registry
from narwhal.sim.gpu.output import StreamWriter
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.sequence import (
    DECODE,
    FINISHED,
    LEFT,
    PREFILL,
    PULLED,
    STALLED,
    TRANSFER,
    WAITING,
    Resumer,
    Seq,
)
from narwhal.sim.gpu.stepcost import StepCost
from narwhal.sim.gpu.switches import FaultSwitches
from narwhal.sim.gpu.totals import EngineTotals
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.timing import StepTiming


class Filed:
    """A sequence filed in a bucket, with the ``run`` it had then (stale once it left the batch).

    An object, not a pair: an entry due again moves to its next bucket as it is, where the
    compiled build would rebuild a pair (a tuple, one a token at one token per chunk)."""

    __slots__ = ("run", "seq")

    def __init__(self, seq: Seq) -> None:
        self.seq = seq
        self.run = seq.run


Due = dict[int, list[Filed]]  # step -> the sequences due then
Chunks = list[tuple[Seq, int]]  # a step's prefill chunks: (sequence, tokens)


def _file(table: Due, step: int, seq: Seq) -> None:
    """File ``seq`` (as it runs now) in ``table``'s bucket for ``step``."""
    bucket = table.get(step)
    if bucket is None:
        table[step] = [Filed(seq)]
    else:
        bucket.append(Filed(seq))


class Scheduler:
    """One engine process's sequences, queues and decode batch (a crash starts a new one)."""

    def __init__(
        self,
        env: simpy.Environment,
        url: str,
        params: EngineParams,
        timing: StepTiming,
        blocks: BlockManager,
        handoffs: Handoffs,
        registry: Registry,
        net: KvNetwork,
        writer: StreamWriter,
        switches: FaultSwitches,
        rng: random.Random,
        totals: EngineTotals,
        wake: Callable[[], None],
    ) -> None:
        self.env = env
        self.url = url
        self.params = params
        self.timing = timing
        self.blocks = blocks
        self.handoffs = handoffs
        self.registry = registry
        self.net = net
        self.writer = writer
        self.switches = switches
        self.rng = rng
        self.cost = StepCost(params)  # host overhead and noise per step
        self.wake = wake  # wakes the engine if idle (there is new work)
        self.totals = totals
        self.seqs: dict[int, Seq] = {}  # every sequence in the engine, by id
        self.waiting: deque[Seq] = deque()
        self.prefilling: list[Seq] = []
        self.decoding: dict[Seq, None] = {}  # in the order they joined (preemption: the last)
        self.transferring = 0
        self.pulled: deque[Seq] = deque()  # pulls done, waiting for room in the batch
        self.ctx_base = 0  # the decode batch's total context at step s: ctx_base + len * s
        # (-(c0 - j), id, run, seq) of every decode that joined: the longest context on top;
        # kept only for a timing that reads it
        self.longest: list[tuple[int, int, int, Seq]] = []
        self.tracks_longest = timing.reads_longest_context
        self.it = 0  # the next step's number
        # async scheduling: what the step being planned can see (see ``apply``)
        self.admit_before = math.inf  # only what was queued by then is admitted
        self.held_seats = 0  # sequences that finished in the last step still hold their seats
        self.planned_at = 0.0  # when the step now running was planned (it started)
        self.block_due: Due = {}
        self.out_due: Due = {}

    def load(self) -> dict[str, int]:
        """A snapshot for the state timeline."""
        return {
            "waiting": len(self.waiting),
            "prefilling": len(self.prefilling),
            "decoding": len(self.decoding),
            "transferring": self.transferring,
            "free_blocks": self.blocks.num_free,
            "handoffs": len(self.handoffs.leases),
        }

    # ------------------------------------------------------------------ arrivals and exits

    def add(self, seq: Seq) -> None:
        self.seqs[seq.id] = seq
        seq.queued_at = self.env.now
        self.waiting.append(seq)
        self.wake()

    def abort(self, seq: Seq) -> None:
        """The router gave up on ``seq`` (closed the stream or timed out the call)."""
        state = seq.state
        if state is FINISHED:
            return
        if state is DECODE:
            self._leave_decode(seq)
        elif state is PREFILL:
            self.prefilling.remove(seq)
        elif state is TRANSFER:
            self.transferring -= 1
        self.finish(seq)  # (a PULLED one is skipped where it waits)

    def finish(self, seq: Seq) -> None:
        seq.state = FINISHED
        seq.run += 1
        # unlink the request from its router-side waiter and stream: no cycle outlives it
        seq.reply = None
        if seq.stream is not None:
            seq.stream.seq = None
            seq.stream = None
        if seq.blocks:
            self.blocks.free(seq.blocks)
            seq.blocks = []
        self.seqs.pop(seq.id, None)

    # ------------------------------------------------------------------ a step

    def plan(self, step: int, now: float) -> tuple[float, Chunks] | None:
        """Compose step ``step``: its duration and prefill chunks (decodes are implied); None
        when there is nothing to run."""
        params = self.params
        preemptions = self.totals.preemptions
        self.planned_at = now
        if step in self.block_due:
            self._grow_blocks(step, now)
        budget = params.max_num_batched_tokens - len(self.decoding)
        chunks: Chunks = []
        pairs = 0.0  # (new token, earlier token) pairs the prefill attention computes
        blocks = self.blocks
        block_size = blocks.block_size
        prefilling = self.prefilling
        i = 0
        while i < len(prefilling) and budget > 0:  # the running prefills, in admission order
            seq = prefilling[i]
            take = min(seq.need - seq.prefilled, budget)
            if not self._grow_prefill(seq, seq.prefilled + take, step, now):
                break  # it preempted itself: nothing behind it runs
            budget -= take
            chunks.append((seq, take))
            pairs += take * (seq.prefilled + take / 2)
            if seq.keys:  # vLLM caches the blocks a step computes when it schedules them
                blocks.cache(seq, (seq.prefilled + take) // block_size)
            i += 1
        if self.totals.preemptions == preemptions:  # vLLM admits nothing in a step that preempts
            budget = self._admit(step, budget, chunks)
            pairs += sum(take * (seq.prefilled + take / 2) for seq, take in chunks[i:])
        tokens = params.max_num_batched_tokens - budget  # decodes + prefill chunk tokens
        if tokens <= 0:
            if self.admit_before == math.inf:
                return None
            self.woke()  # nothing was in flight to plan behind: everything queued is seen
            return self.plan(step, now)
        decodes = len(self.decoding)
        context = self.ctx_base + decodes * step
        longest = self._longest_context(step) if decodes > 1 and self.tracks_longest else 0
        dt = self.timing.batch_s(decodes, tokens - decodes, context, pairs, len(chunks), longest)
        dt = self.cost.seconds(dt, decodes + len(chunks), tokens, self.rng)
        return dt * self.switches.slow, chunks

    def _longest_context(self, step: int) -> int:
        """The longest context in the decode batch at step ``step``."""
        heap = self.longest
        while heap:
            _, _, run, seq = heap[0]
            if seq.state is DECODE and seq.run == run:
                return seq.c0 + step - seq.j
            heapq.heappop(heap)
        return 0

    def _admit(self, step: int, budget: int, chunks: Chunks) -> int:
        """vLLM's waiting queues, while the sequence cap and the token budget allow: pulled
        decodes join the batch first, then waiting sequences are admitted first come first
        served (their first chunk goes to ``chunks``). Returns the budget left."""
        params = self.params
        cap = params.max_num_seqs
        running = len(self.decoding) + len(self.prefilling) + self.held_seats
        # (pulls in flight do not count)
        admit_before = self.admit_before
        pulled = self.pulled
        while pulled and running < cap and budget > 0 and pulled[0].queued_at <= admit_before:
            seq = pulled.popleft()
            if seq.state is PULLED:  # (else aborted meanwhile)
                self._join_decode(seq, step)  # recomputes its last prompt token: one token
                budget -= 1
                running += 1
        blocks = self.blocks
        block_size = blocks.block_size
        waiting = self.waiting
        while waiting and running < cap and budget > 0:
            seq = waiting[0]
            if seq.state is FINISHED:
                waiting.popleft()
                continue
            if seq.queued_at > admit_before:
                break  # queued after this step was planned, under async scheduling
            remote = seq.remote is not None and seq.need == 0
            tokens = seq.prompt if remote else seq.need  # what it pulls or prefills
            # the longest cached prefix, short of the last token (its logits are needed)
            keys = seq.keys
            hit = blocks.match(keys, (tokens - 1) // block_size) if keys else None
            cached = len(hit) * block_size if hit else 0
            if remote:  # the whole prompt's blocks, beside what running prefills still need
                if not blocks.admit(seq, tokens, tokens, hit, self._prefill_reserve(), running > 0):
                    break
                take = 0
            else:
                take = min(tokens - cached, budget)
                if not blocks.admit(seq, tokens, cached + take, hit, 0, running > 0):
                    break
            waiting.popleft()
            seq.cached = cached
            seq.registered = len(hit) if hit else 0
            if params.prefix_caching and not seq.resumed:  # vLLM's prefix-cache counters
                self.totals.prefix_cache_queries += tokens
                self.totals.prefix_cache_hits += cached
            if remote:
                self._start_pull(seq)
                continue
            running += 1
            seq.state = PREFILL
            seq.prefilled = cached
            self.prefilling.append(seq)
            budget -= take
            chunks.append((seq, take))
            if keys:
                blocks.cache(seq, (cached + take) // block_size)
        return budget

    def _prefill_reserve(self) -> int:
        """The blocks the running prefills still need to finish (vLLM keeps them free when it
        starts a KV pull: ``_inflight_prefill_reserved_blocks``)."""
        size = self.blocks.block_size
        return sum(max(0, -(-seq.need // size) - len(seq.blocks)) for seq in self.prefilling)

    def apply(
        self, step: int, chunks: Chunks, now: float, replies: list[tuple[Resumer, object]]
    ) -> None:
        """Step ``step`` ended at ``now``: apply its chunks and its decodes' outputs (prefill
        replies to send go to ``replies``)."""
        seats = len(self.decoding) + len(self.prefilling)
        for seq, take in chunks:
            if seq.state is not PREFILL:
                continue
            seq.prefilled += take
            if seq.prefilled < seq.need:
                continue
            self.prefilling.remove(seq)
            if seq.reply is not None:
                self._reply_prefill(seq, now, replies)
                continue
            seq.gen += 1  # the step that completes a prefill samples a token
            seq.need = 0
            if seq.gen >= seq.out:
                self._end_stream(seq)
            else:
                self._emit(seq, False, now)
                if seq.state is PREFILL:  # its output did not end or stall it
                    self._join_decode(seq, step + 1)
        due = self.out_due.pop(step, None)
        if due:
            later = step + self.params.stream_interval  # where a decode's next chunk is due
            again: list[Filed] = []  # the entries due again then, in order
            for entry in due:
                seq = entry.seq
                if seq.run != entry.run:
                    continue
                finish = seq.j + seq.out - seq.gen - 1
                if step >= finish:
                    self._leave_decode(seq)
                    seq.gen = seq.out
                    self._emit(seq, True, now)
                    if seq.state is not FINISHED:
                        self.finish(seq)
                    continue
                joined_at = seq.gen
                seq.gen += step - seq.j + 1
                self._emit(seq, False, now)
                if seq.state is DECODE and seq.run == entry.run:
                    seq.gen = joined_at  # while decoding, gen stays the count at the join step
                    nxt = step + 1 if seq.fault is not None else min(finish, later)
                    if nxt == later and nxt < finish:
                        again.append(entry)  # (the same run: its entry serves again)
                    elif nxt < finish:
                        _file(self.out_due, nxt, seq)
            if again:  # nothing in the loop files at ``later``: the order is the one-by-one
                bucket = self.out_due.get(later)
                if bucket is None:
                    self.out_due[later] = again
                else:
                    bucket.extend(again)
        self.it = step + 1
        if self.params.async_scheduling:
            # vLLM plans step + 1 while this step runs: it sees what was queued when this step
            # started, and the sequences this step finished still hold their seats
            self.admit_before = self.planned_at
            self.held_seats = max(0, seats - len(self.decoding) - len(self.prefilling))

    def woke(self) -> None:
        """The engine was idle: its next step is planned at once and sees everything queued
        (an idle vLLM engine has no step in flight to plan behind)."""
        self.admit_before = math.inf
        self.held_seats = 0

    # ------------------------------------------------------------------ the decode batch

    def _join_decode(self, seq: Seq, step: int) -> None:
        """Put ``seq`` in the decode batch from ``step`` on (its context: prompt + generated)."""
        remaining = seq.out - seq.gen
        if remaining <= 0:
            self._end_stream(seq)
            return
        seq.state = DECODE
        seq.j = step
        seq.c0 = c0 = seq.prompt + seq.gen
        self.decoding[seq] = None
        self.ctx_base += c0 - step
        if self.tracks_longest:
            heapq.heappush(self.longest, (step - c0, seq.id, seq.run, seq))
        finish = step + remaining - 1
        _file(self.out_due, finish, seq)
        if seq.emitted == 0 or seq.fault is not None:
            first = step  # the first token is sent at once; a faulty stream is checked per step
        else:
            first = min(finish, step + self.params.stream_interval - 1)
        if first < finish:
            _file(self.out_due, first, seq)
        # the step at which its context outgrows its blocks (a decode at step s needs
        # c0 + s - step slots, as vLLM allocates them when it schedules the token)
        due = step + len(seq.blocks) * self.blocks.block_size - c0 + 1
        if due <= finish:
            _file(self.block_due, max(due, step), seq)

    def _leave_decode(self, seq: Seq) -> None:
        del self.decoding[seq]
        self.ctx_base -= seq.c0 - seq.j
        seq.run += 1
        seq.state = LEFT

    def _preempt(self, seq: Seq, step: int, now: float) -> None:
        """vLLM's recompute preemption of a decode: free the blocks, re-prefill prompt +
        generated later."""
        seq.gen += step - seq.j
        self._leave_decode(seq)
        self._emit(seq, False, now)
        if seq.state is not LEFT:  # a stream fault ended or stalled it meanwhile
            return
        self._requeue(seq)

    def _requeue(self, seq: Seq) -> None:
        """A preempted sequence gives its blocks back and waits at the head of the queue."""
        self.totals.preemptions += 1
        self.blocks.free(seq.blocks)
        seq.blocks = []
        seq.registered = 0
        seq.resumed = True
        seq.need = seq.prompt + seq.gen
        seq.prefilled = 0
        seq.state = WAITING
        self.waiting.appendleft(seq)

    def _preempt_last(self, step: int, now: float) -> Seq | None:
        """Preempt the tail of vLLM's running list (the last admitted: a prefill if any runs,
        else the decode that joined last); None when nothing runs."""
        if self.prefilling:
            victim = self.prefilling.pop()
            self._requeue(victim)
            return victim
        if self.decoding:
            victim = next(reversed(self.decoding))
            self._preempt(victim, step, now)
            return victim
        return None

    def _grow_prefill(self, seq: Seq, tokens: int, step: int, now: float) -> bool:
        """Blocks for ``seq``'s next chunk (up to ``tokens``), preempting from the tail of the
        running list while short; False when ``seq`` itself was preempted."""
        blocks = self.blocks
        while not blocks.grow(seq, tokens):
            if self._preempt_last(step, now) is seq:
                return False
        return True

    def _grow_blocks(self, step: int, now: float) -> None:
        """Give every decode due a block at ``step`` one more, preempting when short."""
        due = self.block_due.pop(step)
        blocks = self.blocks
        if blocks.num_free < len(due):  # perhaps short of blocks (stale entries count here too)
            needing = [entry.seq for entry in due if entry.seq.run == entry.run]
            while blocks.num_free < len(needing):
                victim = self._preempt_last(step, now)
                if victim is None:  # pragma: no cover - a decode due is running
                    break
                needing = [seq for seq in needing if seq is not victim]
            due = [Filed(seq) for seq in needing]
        nxt = step + blocks.block_size
        for entry in due:
            seq = entry.seq
            if seq.run != entry.run:
                continue
            if not blocks.append_block(seq):  # pragma: no cover - preemption freed enough
                break
            if nxt <= seq.j + seq.out - seq.gen - 1:
                _file(self.block_due, nxt, seq)

    # ------------------------------------------------------------------ output

    def _emit(self, seq: Seq, final: bool, now: float) -> None:
        """Write ``seq``'s new tokens; a stream fault reached on the way takes it out."""
        fault = self.writer.emit(seq, final, now)
        if fault is None:
            return
        if seq.state is DECODE:
            self._leave_decode(seq)
        if fault == "stall":
            seq.state = STALLED
            seq.run += 1
        else:
            self.finish(seq)

    def _end_stream(self, seq: Seq) -> None:
        if seq.stream is not None:
            self._emit(seq, True, self.env.now)
        self.finish(seq)

    def _reply_prefill(self, seq: Seq, now: float, replies: list[tuple[Resumer, object]]) -> None:
        """A prefill leg finished: hand its blocks off and answer with their descriptor."""
        blocks, seq.blocks = seq.blocks, []
        remote_id, engine_id = self.handoffs.hand_off(seq.rid, blocks, now)
        handoffs = self.handoffs
        body = wire.prefill_reply(
            seq.rid,
            self.params.model,
            seq.prompt,
            blocks,
            engine_id,
            remote_id,
            handoffs.side_host,
            handoffs.side_port,
            seq.cached if self.params.prefix_caching else None,
        )
        resumer = seq.reply
        self.finish(seq)
        if resumer is not None:
            replies.append((resumer, Reply(200, body)))

    # ------------------------------------------------------------------ KV pull

    def _start_pull(self, seq: Seq) -> None:
        """Admit a remote decode: pull its KV, then let it decode (or follow the
        ``kv_load_failure_policy`` when the pull fails)."""
        seq.state = TRANSFER
        self.transferring += 1
        pull = KvPull(
            seq.remote or {},
            seq.prompt,
            self.timing.kv_bytes_per_token,
            self.registry,
            self.switches,
            seq.cached,
        )
        run = seq.run

        def done(ok: bool) -> None:
            if seq.run != run or seq.state is not TRANSFER:
                return  # aborted meanwhile, or the engine crashed
            self.transferring -= 1
            if ok and pull.arrived(self.registry, self.env.now):
                if seq.keys:  # vLLM caches a pulled prompt's blocks once they arrived
                    self.blocks.cache(seq, len(seq.blocks))
                seq.state = PULLED  # it joins the batch at the next step with room for it
                seq.queued_at = self.env.now
                self.pulled.append(seq)
                self.wake()
            elif self.params.kv_load_failure_policy == "recompute":
                # silently recompute what the local prefix cache did not hold (blocks are held)
                seq.need = seq.prompt
                seq.prefilled = seq.cached
                seq.state = PREFILL
                self.prefilling.append(seq)
                self.wake()
            else:  # vLLM's kv_load_failure_policy "fail": an error inside the 200 stream
                stream = seq.stream
                self.finish(seq)
                if stream is not None:
                    self.writer.send_error(stream, self.env.now)
                    self.writer.flush_one(stream)

        self.net.transfer(pull.source_url, self.url, pull.nbytes, done, fail=pull.fail)
