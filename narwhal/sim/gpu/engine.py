"""A simulated vLLM engine: its HTTP surface, and its steps as a chain of SimPy events.

Rule kept here: an engine speaks vLLM's protocol byte for byte (:mod:`narwhal.sim.gpu.wire`),
so the router's real parsers and validators run against it, and its behaviour is engine
behaviour only: it never decides anything for the router. Faults switch that behaviour on and
off (:mod:`narwhal.sim.gpu.switches`, scheduled by :mod:`narwhal.sim.faults`).

Theory of operation:
- The router's transport calls :meth:`SimEngine.call` (a prefill leg, or a GET) and
  :meth:`SimEngine.open_stream` (a decode leg). Both answer at once what vLLM answers at once
  (a refusal, a 404/400/500, the 200 and SSE headers of a stream); the work itself becomes a
  :class:`~narwhal.sim.gpu.sequence.Seq` for the :class:`~narwhal.sim.gpu.scheduler.Scheduler`.
- One engine iteration is one SimPy timeout, planned by the scheduler; its callback applies
  the step, wakes the router where it must see the output now, and plans the next step (a
  chain of events, not a process: nothing to resume in between). With nothing to run the
  engine falls asleep; new work or freed KV blocks wake it with an event at the current time,
  after whatever runs now (so work arriving together is batched together).
- A request's prompt is read as vLLM would tokenize it (:mod:`narwhal.sim.gpu.wire`), and with
  prefix caching on its content identity becomes the keys of its full KV blocks
  (:mod:`narwhal.sim.gpu.prefix`), which the block manager caches.
- A crash loses the process: every connection is reset, and the engine starts over with a new
  engine id, an empty KV cache (:class:`~narwhal.sim.gpu.blocks.BlockManager`), no handoffs
  and a new scheduler; a step in flight then ends without effect. What the engine did over its
  life (steps, tokens, preemptions) is kept.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import simpy

from narwhal.core.ports import CallResult, ConnectFailed, OpenResult, Reply, StreamOpened
from narwhal.core.wire import error_body
from narwhal.engines.block_pool import BlockPool
from narwhal.sim.gpu import wire
from narwhal.sim.gpu.blocks import BlockManager
from narwhal.sim.gpu.handoffs import Handoffs, Registry
from narwhal.sim.gpu.output import StreamWriter
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.prefix import content_keys
from narwhal.sim.gpu.scheduler import Chunks, Scheduler
from narwhal.sim.gpu.sequence import EOF, FINISHED, RESET, Resumer, Seq, SimStream
from narwhal.sim.gpu.switches import STREAM_FAULTS, FaultSwitches
from narwhal.sim.gpu.totals import EngineTotals
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.timing import StepTiming

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


class SimEngine:
    """One engine: its HTTP surface, step chain, fault switches and life-long counters."""

    def __init__(
        self,
        env: simpy.Environment,
        url: str,
        index: int,
        params: EngineParams,
        timing: StepTiming,
        net: KvNetwork,
        registry: Registry,
        rng: random.Random,
        *,
        on_state: Callable[[SimEngine, str], None] | None = None,
    ) -> None:
        self.env = env
        self.url = url
        self.index = index
        self.params = params
        self.timing = timing
        self.net = net
        self.registry = registry  # engine id -> a producer's handoffs (shared by the fleet)
        self.rng = rng
        self.on_state = on_state or (lambda engine, state: None)
        self.switches = FaultSwitches(rng)
        self.totals = EngineTotals()
        self.writer = StreamWriter(params.coalesce_reads, self.totals)
        self._sid = 0
        self._asleep = True  # no step scheduled: the next _kick wakes the engine
        self._waking = False  # a wake-up is scheduled (at the current time)
        # the step in flight (one at a time): its number, prefill chunks, duration, scheduler
        self._step: tuple[int, Chunks, float, Scheduler | None] = (0, [], 0.0, None)
        self.engine_id = ""
        self._new_pool: Callable[[BlockPool], None] | None = None  # KV events (kvevents.py)
        self._start_process()

    def _start_process(self) -> None:
        """A new engine process: a new engine id, an empty KV cache, nothing scheduled."""
        if self.engine_id:
            self.registry.pop(self.engine_id)
        self.engine_id = str(uuid.UUID(int=self.rng.getrandbits(128)))  # a UUID, as vLLM's
        params = self.params
        blocks = BlockManager(params.num_blocks, params.block_size, self._blocks_freed)
        if self._new_pool is not None:
            self._new_pool(blocks.pool)
        self.handoffs = Handoffs(
            self.engine_id,
            self.url,
            self.index,
            blocks,
            self.switches,
            self.rng,
            params.kv_lease_s,
        )
        self.registry[self.engine_id] = self.handoffs
        self.scheduler = Scheduler(
            self.env,
            self.url,
            params,
            self.timing,
            blocks,
            self.handoffs,
            self.registry,
            self.net,
            self.writer,
            self.switches,
            self.rng,
            self.totals,
            self._kick,
        )
        self.writer.wake = []

    def _blocks_freed(self) -> None:
        if self.scheduler.waiting:
            self._kick()

    def load(self) -> dict[str, int]:
        """A snapshot for the state timeline."""
        return self.scheduler.load()

    def condition(self) -> str:
        """The engine's own condition, for the state timeline."""
        return self.switches.condition()

    # ------------------------------------------------------------------ the step chain

    def _kick(self) -> None:
        """Wake an idle engine: its next step is planned by an event at the current time, after
        whatever is running now has finished (so work arriving together is batched together)."""
        if self._asleep and not self._waking:
            self._waking = True
            wake = self.env.event()
            wake.callbacks.append(self._on_wake)
            wake.succeed()

    def _on_wake(self, _event: simpy.Event) -> None:
        self._waking = False
        self.scheduler.woke()
        self._next_step(self.env.now)

    def _next_step(self, now: float) -> None:
        """Plan the next step and schedule its end, or fall asleep until :meth:`_kick`."""
        self._asleep = False  # planning may free blocks, which kicks: nothing to wake
        scheduler = self.scheduler
        plan = None
        if not (self.switches.down or self.switches.hung):
            if self.handoffs.expiry:  # leases that may have run out
                self.handoffs.expire(now)
            plan = scheduler.plan(scheduler.it, now)
        if plan is None:
            self._asleep = True
            return
        dt, chunks = plan
        self._step = (scheduler.it, chunks, dt, scheduler)
        self.env.timeout(dt).callbacks.append(self._end_step)

    def _end_step(self, _event: simpy.Event) -> None:
        step, chunks, dt, scheduler = self._step
        now = self.env.now
        if scheduler is self.scheduler:  # else the engine crashed during the step
            self.totals.steps += 1
            self.totals.busy_s += dt
            replies: list[tuple[Resumer, object]] = []
            scheduler.apply(step, chunks, now, replies)
            self.writer.flush(replies)
        self._next_step(now)

    # ------------------------------------------------------------------ HTTP surface

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        resumer: Resumer,
    ) -> CallResult | Seq:
        """A non-streaming request: an immediate result, or the pending :class:`Seq`."""
        if self.switches.refuses():
            return ConnectFailed("refused")
        if method == "GET":
            return self._get(path)
        if self.switches.answers_5xx():
            return Reply(500, error_body(500, "Internal server error"))
        seq = self._new_seq(path, body or {}, headers)
        if isinstance(seq, Reply):
            return seq
        seq.out = 1  # the router's prefill leg; a plain non-streaming request is clamped too
        seq.reply = resumer
        self.scheduler.add(seq)
        return seq

    def _get(self, path: str) -> Reply:
        if path == "/health":
            return Reply(200, b"")
        if path == "/version":
            return Reply(200, wire.version_body())
        if path == "/v1/models":
            return Reply(200, wire.models_body(self.params.model))
        return Reply(404, error_body(404, "Not Found"))

    def open_stream(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> OpenResult:
        """A streaming request: vLLM sends 200 and SSE headers before generating anything."""
        if self.switches.refuses():
            return ConnectFailed("refused")
        if self.switches.answers_5xx():
            error = error_body(500, "Internal server error")
            return StreamOpened(None, 500, error)
        seq = self._new_seq(path, body, headers)
        if isinstance(seq, Reply):
            return StreamOpened(None, seq.status, seq.body)
        seq.chat = path == "/v1/chat/completions"
        seq.head = wire.chunk_writer(seq.rid, body.get("model", self.params.model), seq.chat)
        seq.ids = body if body.get("return_token_ids") is True else None
        stream = SimStream(self)
        stream.seq = seq
        seq.stream = stream
        seq.fault = self.switches.draw(STREAM_FAULTS) if self.switches.request_faults else None
        params = body.get("kv_transfer_params")
        if isinstance(params, dict) and params.get("do_remote_prefill"):
            seq.remote = params
            seq.need = 0
        if seq.chat:  # with return_token_ids, the prompt's ids ride on the role chunk
            prompt = wire.prompt_ids(body, seq.prompt) if seq.ids is not None else None
            stream.write(self.env.now, seq.head.role_chunk(prompt))
        self.scheduler.add(seq)
        return StreamOpened(stream, 200)

    def _new_seq(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Seq | Reply:
        """The request as a sequence, or vLLM's answer when it cannot be one."""
        if path not in COMPLETION_PATHS:
            return Reply(404, error_body(404, "Not Found"))
        prompt = wire.prompt_tokens(body)
        if prompt is None:
            return Reply(400, error_body(400, "prompt or messages required"))
        fits = self.scheduler.blocks.max_prompt_tokens
        if prompt > fits:  # it could never be admitted; vLLM refuses it (max_model_len) with 400
            message = (
                f"This model's maximum context length is {fits} tokens. However, your "
                f"request has {prompt} input tokens."
            )
            return Reply(400, error_body(400, message))
        out = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        rid = headers.get("X-Request-Id") or f"{self.rng.getrandbits(64):016x}"
        self._sid += 1
        seq = Seq(self._sid, rid, prompt, int(out))
        if self.params.prefix_caching:
            seq.keys = content_keys(body, prompt, self.params.block_size)
        return seq

    def abort(self, seq: Seq) -> None:
        """The router gave up on a request (closed the stream or timed out the call)."""
        self.scheduler.abort(seq)

    def close_stream(self, stream: SimStream) -> None:
        if stream.seq is not None:
            self.abort(stream.seq)
        if stream.ended is None:
            stream.ended = EOF

    def on_new_pool(self, attach: Callable[[BlockPool], None]) -> None:
        """Call ``attach`` with this engine's block pool now and with each new process's."""
        self._new_pool = attach
        attach(self.scheduler.blocks.pool)

    def release_handoff(self, descriptor: dict[str, Any]) -> None:
        self.handoffs.release(descriptor)

    # ------------------------------------------------------------------ fault switches

    def crash(self) -> None:
        """The process dies: connections reset, KV and handoffs lost; refused until restart."""
        self.switches.down = True
        seqs = list(self.scheduler.seqs.values())
        replies: list[tuple[Resumer, object]] = []
        self._start_process()
        for seq in seqs:
            seq.state = FINISHED
            seq.run += 1
            if seq.reply is not None:
                replies.append((seq.reply, ConnectFailed("reset")))
            if seq.stream is not None:
                seq.stream.ended = RESET
                self.writer.wake.append(seq.stream)
        self.on_state(self, "crashed")
        self.writer.flush(replies)
        self._kick()

    def restart(self) -> None:
        self.switches.down = False
        self.on_state(self, self.condition())
        self._kick()

    def set_hung(self, hung: bool) -> None:
        self.switches.hung = hung
        self.on_state(self, self.condition())
        self._kick()

    def set_slow(self, factor: float) -> None:
        self.switches.slow = factor
        self.on_state(self, self.condition())

    def add_request_fault(self, kind: str, probability: float, after: int) -> None:
        self.switches.request_faults.append((kind, probability, after))
        self.on_state(self, self.condition())

    def remove_request_fault(self, kind: str, probability: float, after: int) -> None:
        if (kind, probability, after) in self.switches.request_faults:
            self.switches.request_faults.remove((kind, probability, after))
        self.on_state(self, self.condition())
