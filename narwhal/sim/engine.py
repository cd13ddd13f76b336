"""A simulated vLLM engine: continuous batching over KV-cache blocks, one SimPy event per step.

Rule kept here: an engine speaks vLLM's protocol byte for byte (docs/contract.md: the
prefill reply is a JSON body carrying NixlConnector ``kv_transfer_params``; a decode stream is
SSE ``data: {...}`` chunks ending with ``data: [DONE]``), so the router's real parsers and
validators run against it. Its behaviour is engine behaviour only: it never decides anything
for the router. Faults (:mod:`narwhal.sim.faults`) switch its behaviour on and off.

Theory of operation (one engine iteration = one ``env.timeout``):
- Sequences wait FCFS. Each step schedules every running decode first (one token each), then
  fills the rest of the token budget (``max_num_batched_tokens``) with prefill chunks (chunked
  prefill), admitting waiting sequences while the sequence cap (``max_num_seqs``) and free KV
  blocks allow. A decode leg whose KV lives on a producer is admitted with blocks for its prompt
  and first pulls the KV over the :class:`~narwhal.sim.kvnet.KvNetwork`; then it decodes.
- KV memory is ``num_blocks`` blocks of ``block_size`` tokens with real block ids. A decode
  needs a new block each ``block_size`` tokens; when none is free the most recently started
  decode is preempted (vLLM's recompute preemption): its blocks are freed and it goes back to
  the head of the queue to re-prefill its prompt plus the tokens it already generated.
- One engine iteration is one SimPy timeout whose callback applies the step and plans the
  next (a chain of events, not a process: nothing to resume in between).
- Step time is a :class:`~narwhal.sim.timing.StepTiming` (the fitted
  :class:`~narwhal.sim.timing.StepModel`, or the emulator's linear model) plus the per-step
  overhead, times the slow-down factor and a seeded jitter.
- Per-token work is avoided: a decode that joins the batch at step ``j`` with context ``c0``
  has context ``c0 + (s - j)`` at step ``s``, so the batch's total context is kept as one running
  sum, and the steps at which a sequence needs a block, must emit output (every
  ``stream_interval`` tokens, as vLLM's ``--stream-interval``) or finishes are put in buckets
  keyed by step number. A step therefore costs O(1) plus the sequences that have something due.
- Output goes to a :class:`SimStream` buffer as ``(arrival time, bytes)``. The router is woken
  at once for a stream's first output (it replaces the first-token deadline by the earlier
  silence deadline) and for what ends or breaks a stream ([DONE], an error event, a close or
  reset); later plain token chunks wait for its next wake-up (at the latest the deadline of
  the read it waits on) and reach it as one :class:`~narwhal.core.ports.Burst`, which the core
  reads exactly as the same chunks one at a time (``[sim] coalesce_reads = false`` wakes it
  for every chunk).
- A producer keeps the blocks of a finished prefill as a *handoff* until a consumer pulls it,
  the router releases it, or the lease (``kv_lease_s``) expires.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import simpy

from narwhal.core.ports import (
    Burst,
    CallResult,
    ChunkResult,
    ConnectFailed,
    OpenResult,
    Reply,
    StreamEnd,
    StreamOpened,
)
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.timing import StepTiming

CREATED = 1_700_000_000  # the "created" field of engine responses (fixed: runs replay exactly)
ENGINE_VERSION = "0.32.0"
ERROR_500 = (
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\n'
)
DONE = b"data: [DONE]\n\n"

# stream-level request faults (decided per request while the fault is active)
STREAM_FAULTS = ("stall", "early_done", "inband_error", "disconnect")


class Resumer(Protocol):
    """The router side of a pending call: fired once with the call's result."""

    def fire(self, value: object) -> None: ...


@dataclass(frozen=True)
class EngineParams:
    """What one simulated engine is (from the scenario's ``[fleet]``)."""

    model: str
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_blocks: int = 50_000
    step_overhead_s: float = 0.002
    jitter: float = 0.05  # each step is multiplied by uniform(1 - jitter, 1 + jitter)
    stream_interval: int = 1  # tokens per streamed chunk (vLLM --stream-interval)
    kv_lease_s: float = 30.0
    kv_load_failure_policy: str = "fail"  # "fail" | "recompute"
    coalesce_reads: bool = True  # plain token chunks wait for the router's next wake-up


class SimStream:
    """An open decode stream: bytes the engine produced and the router has not read yet."""

    __slots__ = ("buffer", "deadline", "ended", "engine", "seq", "timer_at", "waiter")

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.seq: Seq | None = None
        self.buffer: list[tuple[float, bytes]] = []  # (arrival time, bytes), oldest first
        self.waiter: Resumer | None = None  # set by the transport while the router waits
        self.deadline = 0.0  # the waiter's deadline (the transport's lazy timer reads it)
        self.timer_at = -1.0  # when the transport's pending deadline timer fires (-1: none)
        self.ended: str | None = None  # None | "eof" (clean close) | "reset"

    @property
    def status(self) -> int:
        return 200


class Seq:
    """One request inside an engine (a prefill leg or a decode leg)."""

    __slots__ = (
        "blocks",
        "c0",
        "chat",
        "chunk",
        "chunk_tokens",
        "emitted",
        "fault",
        "gen",
        "head",
        "id",
        "j",
        "need",
        "out",
        "prefilled",
        "prompt",
        "remote",
        "reply",
        "rid",
        "run",
        "state",
        "stream",
        "tail",
    )

    def __init__(self, sid: int, rid: str, prompt: int, out: int) -> None:
        self.id = sid
        self.rid = rid
        self.prompt = prompt
        self.out = out
        self.gen = 0  # tokens generated so far
        self.emitted = 0  # tokens sent to the stream
        self.need = prompt  # tokens to prefill (0 for a remote decode after its pull)
        self.prefilled = 0
        self.blocks: list[int] = []
        self.run = 0  # bumped whenever the sequence leaves the batch: stale bucket entries skip
        self.j = 0  # step at which it joined the decode batch
        self.c0 = 0  # its context at that step
        self.state = "waiting"  # waiting | prefill | transfer | decode | stalled | gone
        self.reply: Resumer | None = None  # prefill leg: the pending call
        self.stream: SimStream | None = None  # decode leg
        self.remote: dict[str, Any] | None = None  # decode leg: the descriptor to pull
        self.fault: tuple[str, int] | None = None  # (stream fault kind, after this many tokens)
        self.chat = False
        self.head = b""
        self.chunk = b""  # the bytes of the last non-final chunk, for ``chunk_tokens`` tokens
        self.chunk_tokens = 0
        self.tail = b""


def take_chunk(stream: SimStream) -> ChunkResult | None:
    """What a read of ``stream`` returns now, or None when the router must wait."""
    if stream.buffer:
        reads = tuple(stream.buffer)
        stream.buffer.clear()
        return Burst(reads)
    if stream.ended is None:
        return None
    return ConnectFailed("reset") if stream.ended == "reset" else StreamEnd()


class _Handoff:
    __slots__ = ("blocks", "expires")

    def __init__(self, blocks: list[int], expires: float) -> None:
        self.blocks = blocks
        self.expires = expires


def _prompt_tokens(body: dict[str, Any]) -> int | None:
    """The simulator's tokenizer: one token per character (as the tiny test model), or per id."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) + 1
    if isinstance(prompt, list) and prompt:
        return len(prompt) if isinstance(prompt[0], int) else sum(len(str(p)) for p in prompt) + 1
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return sum(len(str(m.get("content", ""))) + 4 for m in messages if isinstance(m, dict)) + 2
    return None


def _chunk_body(n: int, final: bool, chat: bool) -> bytes:
    """The rest of a streamed chunk after its head: ``n`` tokens of filler text."""
    if chat:
        reason = b'"length"' if final else b"null"
        return (
            b'{"content":"'
            + b"x" * n
            + b'"},"logprobs":null,"finish_reason":'
            + reason
            + (b"}]}\n\n")
        )
    if final:
        return b"x" * n + b'","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
    return b"x" * n + b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'


def _json_value(value: Any) -> str:
    """``json.dumps(value)``; a plain string (ids, model names: 5 per request) skips the encoder.

    A string is plain when JSON writes it as it is: printable ASCII (``" "`` to ``"~"``) without
    ``"`` or ``\\``. Four scans in C; ``str.strip`` of a character set looked each character
    up in the set's text (over a quarter of the prefill reply's cost)."""
    if (
        isinstance(value, str)
        and value.isascii()
        and value.isprintable()
        and value.find('"') < 0
        and value.find("\\") < 0
    ):
        return f'"{value}"'
    return json.dumps(value)


_ID_TEXT: list[str] = []  # str(i) for block ids 0, 1, ...: shared by every engine
_ID_TEXT_MAX = 1 << 20  # beyond this many blocks an engine formats its ids as it goes


def _block_id_texts(num_blocks: int) -> list[str]:
    """The decimal text of every block id below ``num_blocks`` (looking up a prefill reply's
    ids is about 4x faster than formatting them, and they are most of its bytes)."""
    if len(_ID_TEXT) < num_blocks:
        _ID_TEXT.extend(map(str, range(len(_ID_TEXT), num_blocks)))
    return _ID_TEXT


_PAD_32 = 1 << 32  # hex(bits | _PAD_32)[3:] is f"{bits:08x}" for 32 random bits


def _json_error(status: int, message: str, kind: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    ).encode()


def _due(table: dict[int, list[tuple[Seq, int]]], step: int, seq: Seq) -> None:
    """Put ``seq`` (as it runs now) in ``table``'s bucket for ``step``."""
    bucket = table.get(step)
    if bucket is None:
        table[step] = [(seq, seq.run)]
    else:
        bucket.append((seq, seq.run))


class SimEngine:
    """One engine: its scheduler (a chain of step events), KV blocks, handoffs, streams and fault
    switches."""

    def __init__(
        self,
        env: simpy.Environment,
        url: str,
        index: int,
        params: EngineParams,
        timing: StepTiming,
        net: KvNetwork,
        registry: dict[str, SimEngine],
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
        self.registry = registry  # engine id -> engine (how a consumer finds a producer)
        self.rng = rng
        self.on_state = on_state or (lambda engine, state: None)
        self.side_host = f"10.0.{index // 250}.{index % 250 + 1}"
        self.side_port = 5600
        self.bs = params.block_size
        self.model_json = _json_value(params.model)  # in every reply and chunk
        self.id_text = (
            _block_id_texts(params.num_blocks) if params.num_blocks <= _ID_TEXT_MAX else []
        )
        self.watermark = max(1, params.num_blocks // 100)
        # fault switches
        self.down = False
        self.hung = False
        self.slow = 1.0
        self.request_faults: list[tuple[str, float, int]] = []  # (kind, probability, after)
        # counters
        self.steps = 0
        self.preemptions = 0
        self.tokens_out = 0
        # tokens each stream sent before a clean [DONE], by request id (X-Request-Id): what
        # the client got, which an early [DONE] makes fewer than max_tokens
        self.delivered: dict[str, int] = {}
        self.busy_s = 0.0
        self._sid = 0
        self._generation = 0
        self.engine_id = ""
        self._reset_state()
        self._asleep = True  # no step scheduled: the next _kick wakes the engine
        self._waking = False  # a wake-up is scheduled (at the current time)
        # the step in flight (one at a time): its number, prefill chunks, duration, generation
        self._step: tuple[int, list[tuple[Seq, int]], float, int] = (0, [], 0.0, 0)
        self._step_end = self._end_step  # the bound method, made once

    # ------------------------------------------------------------------ state

    def _reset_state(self) -> None:
        self._generation += 1
        if self.engine_id:
            self.registry.pop(self.engine_id, None)
        self.engine_id = f"{self.rng.getrandbits(128):032x}"
        self.engine_id = "-".join(
            (
                self.engine_id[:8],
                self.engine_id[8:12],
                self.engine_id[12:16],
                self.engine_id[16:20],
                self.engine_id[20:],
            )
        )
        self.registry[self.engine_id] = self
        self.free_ids: list[int] = list(range(self.params.num_blocks - 1, -1, -1))
        self.seqs: dict[int, Seq] = {}
        self.waiting: deque[Seq] = deque()
        self.prefilling: list[Seq] = []
        self.decoding: dict[Seq, None] = {}
        self.transferring = 0
        self.ctx_base = 0
        self.it = 0
        self.in_step = False
        self.block_due: dict[int, list[tuple[Seq, int]]] = {}
        self.out_due: dict[int, list[tuple[Seq, int]]] = {}
        self.handoffs: dict[str, _Handoff] = {}
        self.handoff_order: deque[tuple[float, str]] = deque()
        self._wake: list[SimStream] = []

    @property
    def free_blocks(self) -> int:
        return len(self.free_ids)

    def load(self) -> dict[str, int]:
        """A snapshot for the state timeline."""
        return {
            "waiting": len(self.waiting),
            "prefilling": len(self.prefilling),
            "decoding": len(self.decoding),
            "transferring": self.transferring,
            "free_blocks": len(self.free_ids),
            "handoffs": len(self.handoffs),
        }

    def _kick(self) -> None:
        """Wake an idle engine: its next step is planned by an event at the current time, after
        whatever is running now has finished (so work arriving together is batched together)."""
        if self._asleep and not self._waking:
            self._waking = True
            wake = self.env.event()
            wake.callbacks.append(self._on_wake)
            wake.succeed()

    # ------------------------------------------------------------------ HTTP surface

    def _refuses(self) -> bool:
        if self.down:
            return True
        return any(
            kind == "refused" and (p >= 1.0 or self.rng.random() < p)
            for kind, p, _ in self.request_faults
        )

    def _answers_5xx(self) -> bool:
        return any(
            kind == "http_5xx" and (p >= 1.0 or self.rng.random() < p)
            for kind, p, _ in self.request_faults
        )

    def _draw(self, kinds: tuple[str, ...]) -> tuple[str, int] | None:
        for kind, p, after in self.request_faults:
            if kind in kinds and (p >= 1.0 or self.rng.random() < p):
                return kind, after
        return None

    def has_fault(self, kind: str) -> bool:
        """Whether this request is hit by an active fault of ``kind`` (drawn per request)."""
        return bool(self.request_faults) and self._draw((kind,)) is not None

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        resumer: Resumer,
    ) -> CallResult | Seq:
        """A non-streaming request: an immediate result, or the pending :class:`Seq`."""
        if self._refuses():
            return ConnectFailed("refused")
        if method == "GET":
            return self._get(path)
        if self._answers_5xx():
            return Reply(500, _json_error(500, "Internal server error", "InternalServerError"))
        seq_or_reply = self._new_seq(path, body or {}, headers)
        if isinstance(seq_or_reply, Reply):
            return seq_or_reply
        seq = seq_or_reply
        seq.out = 1  # the router's prefill leg; a plain non-streaming request is clamped too
        seq.reply = resumer
        self._enqueue(seq)
        return seq

    def _get(self, path: str) -> Reply:
        if path == "/health":
            return Reply(200, b"")
        if path == "/version":
            return Reply(200, json.dumps({"version": ENGINE_VERSION}).encode())
        if path == "/v1/models":
            body = {"object": "list", "data": [{"id": self.params.model, "object": "model"}]}
            return Reply(200, json.dumps(body).encode())
        return Reply(404, _json_error(404, "Not Found", "NotFoundError"))

    def open_stream(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> OpenResult:
        """A streaming request: vLLM sends 200 and SSE headers before generating anything."""
        if self._refuses():
            return ConnectFailed("refused")
        if self._answers_5xx():
            return StreamOpened(
                None, 500, _json_error(500, "Internal server error", "InternalServerError")
            )
        seq_or_reply = self._new_seq(path, body, headers)
        if isinstance(seq_or_reply, Reply):
            return StreamOpened(None, seq_or_reply.status, seq_or_reply.body)
        seq = seq_or_reply
        stream = SimStream(self)
        stream.seq = seq
        seq.stream = stream
        seq.fault = self._draw(STREAM_FAULTS) if self.request_faults else None
        params = body.get("kv_transfer_params")
        if isinstance(params, dict) and params.get("do_remote_prefill"):
            seq.remote = params
            seq.need = 0
        if seq.chat:
            role = (
                seq.head + b'{"role":"assistant","content":""},"logprobs":null,'
                b'"finish_reason":null}]}\n\n'
            )
            stream.buffer.append((self.env.now, role))
        self._enqueue(seq)
        return StreamOpened(stream, 200)

    def _new_seq(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Seq | Reply:
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return Reply(404, _json_error(404, "Not Found", "NotFoundError"))
        prompt = _prompt_tokens(body)
        if prompt is None:
            return Reply(400, _json_error(400, "prompt or messages required", "BadRequestError"))
        fits = (self.params.num_blocks - self.watermark) * self.bs - 1
        if prompt > fits:  # it could never be admitted; vLLM refuses it (max_model_len) with 400
            return Reply(
                400,
                _json_error(
                    400,
                    f"This model's maximum context length is {fits} tokens. However, your "
                    f"request has {prompt} input tokens.",
                    "BadRequestError",
                ),
            )
        out = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        rid = headers.get("X-Request-Id") or f"{self.rng.getrandbits(64):016x}"
        self._sid += 1
        seq = Seq(self._sid, rid, prompt, int(out))
        chat = path == "/v1/chat/completions"
        seq.chat = chat
        model = body.get("model", self.params.model)
        model = self.model_json if model == self.params.model else _json_value(model)
        if chat:
            seq.head = (
                f'data: {{"id":"chatcmpl-{rid}","object":"chat.completion.chunk",'
                f'"created":{CREATED},"model":{model},"choices":[{{"index":0,"delta":'
            ).encode()
        else:
            seq.head = (
                f'data: {{"id":"cmpl-{rid}","object":"text_completion","created":{CREATED},'
                f'"model":{model},"choices":[{{"index":0,"text":"'
            ).encode()
        self.seqs[seq.id] = seq
        return seq

    def _enqueue(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self._kick()

    def abort(self, seq: Seq) -> None:
        """The router gave up on a request (closed the stream or timed out the call)."""
        if seq.state == "gone":
            return
        if seq.state == "decode":
            self._leave_decode(seq)
        elif seq.state == "prefill":
            self.prefilling.remove(seq)
        elif seq.state == "transfer":
            self.transferring -= 1
        self._finish(seq)

    def close_stream(self, stream: SimStream) -> None:
        if stream.seq is not None:
            self.abort(stream.seq)
        stream.ended = stream.ended or "eof"

    def release_handoff(self, descriptor: dict[str, Any]) -> None:
        if descriptor.get("remote_engine_id") != self.engine_id:
            return
        rid = descriptor.get("remote_request_id")
        handoff = self.handoffs.pop(rid, None) if isinstance(rid, str) else None
        if handoff is not None:
            self._free(handoff.blocks)

    # ------------------------------------------------------------------ blocks

    def _alloc(self, seq: Seq, n: int) -> None:
        free = self.free_ids
        if n == 1:
            seq.blocks.append(free.pop())
        elif n > 0:
            seq.blocks.extend(free[-n:])
            del free[-n:]

    def _free(self, blocks: list[int]) -> None:
        self.free_ids.extend(blocks)
        if self.waiting:
            self._kick()

    def _finish(self, seq: Seq) -> None:
        seq.state = "gone"
        seq.run += 1
        # unlink the request from its router-side waiter and stream: no cycle outlives it
        seq.reply = None
        if seq.stream is not None:
            seq.stream.seq = None
            seq.stream = None
        if seq.blocks:
            self._free(seq.blocks)
            seq.blocks = []
        self.seqs.pop(seq.id, None)

    def _expire_handoffs(self, now: float) -> None:
        order = self.handoff_order
        while order and order[0][0] <= now:
            _, rid = order.popleft()
            handoff = self.handoffs.get(rid)
            if handoff is not None and handoff.expires <= now:
                del self.handoffs[rid]
                self._free(handoff.blocks)

    def take_handoff(self, rid: str) -> bool:
        """A consumer finished pulling ``rid``: free its blocks. False if it is gone."""
        handoff = self.handoffs.pop(rid, None)
        if handoff is None or self.down:
            return False
        self._free(handoff.blocks)
        # the lease ran out: the blocks were the engine's to reuse, even if no step noticed
        return handoff.expires > self.env.now

    # ------------------------------------------------------------------ decode batch

    def _join_decode(self, seq: Seq, step: int) -> None:
        """Put ``seq`` in the decode batch from ``step`` on (its context: prompt + generated)."""
        remaining = seq.out - seq.gen
        if remaining <= 0:
            self._end_stream(seq, b"")
            return
        seq.state = "decode"
        seq.j = step
        seq.c0 = c0 = seq.prompt + seq.gen
        self.decoding[seq] = None
        self.ctx_base += c0 - step
        finish = step + remaining - 1
        _due(self.out_due, finish, seq)
        if seq.emitted == 0 or seq.fault is not None:
            first = step  # the first token is sent at once; a faulty stream is checked per step
        else:
            first = min(finish, step + self.params.stream_interval - 1)
        if first < finish:
            _due(self.out_due, first, seq)
        due = step + len(seq.blocks) * self.bs - c0
        if due <= finish:
            _due(self.block_due, max(due, step), seq)

    def _leave_decode(self, seq: Seq) -> None:
        del self.decoding[seq]
        self.ctx_base -= seq.c0 - seq.j
        seq.run += 1
        seq.state = "left"

    def _preempt(self, seq: Seq, step: int, now: float) -> None:
        """vLLM's recompute preemption: free the blocks, re-prefill prompt + generated later."""
        seq.gen += step - seq.j
        self._leave_decode(seq)
        self._emit(seq, final=False, now=now)
        if seq.state != "left":  # a stream fault ended or stalled it meanwhile
            return
        self.preemptions += 1
        self.free_ids.extend(seq.blocks)
        seq.blocks = []
        seq.need = seq.prompt + seq.gen
        seq.prefilled = 0
        seq.state = "waiting"
        self.waiting.appendleft(seq)

    def _grow_blocks(self, step: int, now: float) -> None:
        due = self.block_due.pop(step, None)
        if not due:
            return
        free, nxt = self.free_ids, step + self.bs
        if len(free) < len(due):  # perhaps short of blocks (stale entries count here too)
            needing = [seq for seq, run in due if seq.run == run]
            while len(free) < len(needing) and self.decoding:
                victim = next(reversed(self.decoding))
                self._preempt(victim, step, now)
                needing = [seq for seq in needing if seq is not victim]
            due = [(seq, seq.run) for seq in needing]
        for seq, run in due:
            if seq.run != run:
                continue
            if not free:  # pragma: no cover - preemption above freed enough
                break
            seq.blocks.append(free.pop())
            if nxt <= seq.j + seq.out - seq.gen - 1:
                _due(self.block_due, nxt, seq)

    # ------------------------------------------------------------------ output

    def _emit(self, seq: Seq, *, final: bool, now: float) -> None:
        """Send the tokens generated since the last chunk (and the end of stream if final).

        ``now`` is ``env.now``, read once by the caller (a property call: a step emits many).
        """
        stream = seq.stream
        n = seq.gen - seq.emitted
        if stream is None:
            return
        if seq.fault is not None and self._apply_fault(seq, n, now):
            return
        first = seq.emitted == 0  # the first output moves the router's deadline earlier
        if n > 0:
            self.tokens_out += n
            seq.emitted = seq.gen
            if n == seq.chunk_tokens and not final:  # the usual chunk: its bytes are known
                data = seq.chunk
            else:
                data = seq.head + _chunk_body(n, final, seq.chat)
                if not final:
                    seq.chunk_tokens, seq.chunk = n, data
            stream.buffer.append((now, data))
        if final:
            self.delivered[seq.rid] = seq.emitted
            stream.buffer.append((now, DONE))
            stream.ended = "eof"
        # After the first output, a plain token chunk only moves the router's read deadline
        # later and changes nothing outside its request, so (when coalescing) it waits for the
        # router's next wake-up: the end of the stream, a fault, or that deadline (the
        # transport's timer), and reaches it stamped with its arrival time.
        if stream.waiter is not None and (final or first or not self.params.coalesce_reads):
            self._wake.append(stream)

    def _apply_fault(self, seq: Seq, n: int, now: float) -> bool:
        """A faulty stream reached its fault point: act it out. True if it ended the stream."""
        assert seq.fault is not None and seq.stream is not None
        kind, after = seq.fault
        if seq.emitted + n < after:
            return False
        stream = seq.stream
        allowed = max(0, after - seq.emitted)
        if allowed:
            seq.fault = None
            saved = seq.gen
            seq.gen = seq.emitted + allowed
            self._emit(seq, final=False, now=now)
            seq.gen = saved
            seq.fault = (kind, after)
        if kind == "stall":  # the stream stays open and says nothing more
            if seq.state == "decode":
                self._leave_decode(seq)
            seq.state = "stalled"
            seq.run += 1
            return True
        if kind == "early_done":
            self.delivered[seq.rid] = seq.emitted
            stream.buffer.append((now, DONE))
            stream.ended = "eof"
        elif kind == "inband_error":
            stream.buffer.append((now, ERROR_500))
            stream.buffer.append((now, DONE))
            stream.ended = "eof"
        else:  # disconnect: the connection closes before [DONE]
            stream.ended = "eof"
        if seq.state == "decode":
            self._leave_decode(seq)
        self._finish(seq)
        if stream.waiter is not None:
            self._wake.append(stream)
        return True

    def _end_stream(self, seq: Seq, extra: bytes) -> None:
        if seq.stream is not None:
            if extra:
                seq.stream.buffer.append((self.env.now, extra))
            self._emit(seq, final=True, now=self.env.now)
        self._finish(seq)

    def _reply_prefill(self, seq: Seq, replies: list[tuple[Resumer, object]]) -> None:
        blocks = seq.blocks
        seq.blocks = []
        rid = f"cmpl-{seq.rid}-0-" + hex(self.rng.getrandbits(32) | _PAD_32)[3:]  # :08x, faster
        release_now = self.has_fault("release_handoff")
        if not release_now:
            expires = self.env.now + self.params.kv_lease_s
            self.handoffs[rid] = _Handoff(blocks, expires)
            self.handoff_order.append((expires, rid))
        engine_id = "" if self.has_fault("bad_descriptor") else self.engine_id
        text = self.id_text
        ids = ",".join([text[b] for b in blocks] if text else map(str, blocks))
        p = seq.prompt
        # vLLM's completion body, written directly (json.dumps of the same dict is the slow path)
        body = (
            f'{{"id":{_json_value("cmpl-" + seq.rid)},"object":"text_completion",'
            f'"created":{CREATED},"model":{self.model_json},"choices":[{{'
            f'"index":0,"text":"x","logprobs":null,"finish_reason":"length","stop_reason":null,'
            f'"prompt_logprobs":null}}],"usage":{{"prompt_tokens":{p},"total_tokens":{p + 1},'
            f'"completion_tokens":1}},"kv_transfer_params":{{"do_remote_prefill":true,'
            f'"do_remote_decode":false,"remote_block_ids":[[{ids}]],'
            f'"remote_engine_id":"{engine_id}","remote_request_id":{_json_value(rid)},'
            f'"remote_host":"{self.side_host}","remote_port":{self.side_port},"tp_size":1,'
            f'"dcp_size":1,"pp_size":1,"remote_num_tokens":{p},'
            f'"remote_blocks_expiry_time":null,"transfer_mode":"pull",'
            f'"remote_prefill_cached_tokens":0}}}}'
        ).encode()
        resumer = seq.reply
        self._finish(seq)
        if release_now:
            self._free(blocks)
        if resumer is not None:
            replies.append((resumer, Reply(200, body)))

    # ------------------------------------------------------------------ KV pull

    def _start_pull(self, seq: Seq) -> None:
        seq.state = "transfer"
        self.transferring += 1
        remote = seq.remote or {}
        producer = self.registry.get(str(remote.get("remote_engine_id")))
        tokens = int(remote.get("remote_num_tokens") or seq.prompt)
        nbytes = tokens * self.timing.kv_bytes_per_token
        fail = (
            self.has_fault("kv_transfer_fail")
            or producer is None
            or (producer.has_fault("kv_transfer_fail"))
        )
        run, generation = seq.run, self._generation
        rid = str(remote.get("remote_request_id"))

        def done(ok: bool) -> None:
            if generation != self._generation or seq.run != run or seq.state != "transfer":
                return
            self.transferring -= 1
            if ok and producer is not None and not producer.take_handoff(rid):
                ok = False
            if ok:
                seq.state = "ready"
                self._join_decode(seq, self.it + 1 if self.in_step else self.it)
                self._kick()
            elif self.params.kv_load_failure_policy == "recompute":
                seq.need = seq.prompt  # silently recompute the prompt (blocks are held already)
                seq.prefilled = 0
                seq.state = "prefill"
                self.prefilling.append(seq)
                self._kick()
            else:  # vLLM's kv_load_failure_policy "fail": an error inside the 200 stream
                stream = seq.stream
                self._finish(seq)
                if stream is not None:
                    stream.buffer.append((self.env.now, ERROR_500))
                    stream.buffer.append((self.env.now, DONE))
                    stream.ended = "eof"
                    self._flush_one(stream)

        self.net.transfer(producer.url if producer else "?", self.url, nbytes, done, fail=fail)

    # ------------------------------------------------------------------ the scheduler

    def _plan(self, step: int, now: float) -> tuple[float, list[tuple[Seq, int]]] | None:
        """Compose the batch of ``step``: its duration and prefill chunks (decodes implied)."""
        params = self.params
        if self.handoff_order:
            self._expire_handoffs(now)
        if step in self.block_due:
            self._grow_blocks(step, now)
        decodes = len(self.decoding)
        budget = params.max_num_batched_tokens - decodes
        chunks: list[tuple[Seq, int]] = []
        pairs = 0.0
        for seq in self.prefilling:
            if budget <= 0:
                break
            take = min(seq.need - seq.prefilled, budget)
            budget -= take
            chunks.append((seq, take))
            pairs += take * (seq.prefilled + take / 2)
        seqs = decodes + len(self.prefilling) + self.transferring
        waiting = self.waiting
        bs = self.bs
        while waiting and seqs < params.max_num_seqs:
            seq = waiting[0]
            if seq.state == "gone":
                waiting.popleft()
                continue
            remote = seq.remote is not None and seq.need == 0
            if not remote and budget <= 0:
                break
            tokens = (seq.prompt if remote else seq.need) + 1
            blocks = -(-tokens // bs)
            if len(self.free_ids) - blocks < self.watermark:
                break
            waiting.popleft()
            self._alloc(seq, blocks)
            seqs += 1
            if remote:
                self._start_pull(seq)
                continue
            seq.state = "prefill"
            self.prefilling.append(seq)
            take = min(seq.need, budget)
            budget -= take
            chunks.append((seq, take))
            pairs += take * take / 2
        tokens = params.max_num_batched_tokens - budget  # decodes + prefill chunk tokens
        if tokens <= 0:
            return None
        context = self.ctx_base + len(self.decoding) * step
        dt = self.timing.batch_s(decodes, tokens - decodes, context, pairs)
        dt += params.step_overhead_s
        jitter = params.jitter
        if jitter:
            dt *= 1.0 + jitter * (2.0 * self.rng.random() - 1.0)
        return dt * self.slow, chunks

    def _apply(self, step: int, chunks: list[tuple[Seq, int]], now: float) -> None:
        replies: list[tuple[Resumer, object]] = []
        for seq, take in chunks:
            if seq.state != "prefill":
                continue
            seq.prefilled += take
            if seq.prefilled < seq.need:
                continue
            self.prefilling.remove(seq)
            if seq.reply is not None:
                self._reply_prefill(seq, replies)
                continue
            seq.gen += 1  # the step that completes a prefill samples a token
            seq.need = 0
            if seq.gen >= seq.out:
                self._end_stream(seq, b"")
            else:
                self._emit(seq, final=False, now=now)
                if seq.state != "gone" and seq.state != "stalled":
                    self._join_decode(seq, step + 1)
        due = self.out_due.pop(step, None)
        if due:
            interval = self.params.stream_interval
            for seq, run in due:
                if seq.run != run:
                    continue
                finish = seq.j + seq.out - seq.gen - 1
                produced = seq.gen + (step - seq.j + 1)
                if step >= finish:
                    self._leave_decode(seq)
                    seq.gen = seq.out
                    self._emit(seq, final=True, now=now)
                    if seq.state != "gone":
                        self._finish(seq)
                    continue
                base = seq.gen
                seq.gen = produced
                self._emit(seq, final=False, now=now)
                if seq.state == "decode" and seq.run == run:
                    seq.gen = base  # while decoding, gen stays the count at the join step
                    nxt = step + 1 if seq.fault is not None else min(finish, step + interval)
                    if nxt < finish:
                        _due(self.out_due, nxt, seq)
        self.it = step + 1
        self._flush(replies)

    def _flush_one(self, stream: SimStream) -> None:
        waiter = stream.waiter
        if waiter is None:
            return
        result = take_chunk(stream)
        if result is not None:
            stream.waiter = None
            waiter.fire(result)

    def _flush(self, replies: list[tuple[Resumer, object]]) -> None:
        while self._wake:  # a resumed router task may queue more (e.g. by aborting)
            wake, self._wake = self._wake, []
            for stream in wake:
                self._flush_one(stream)
        for resumer, value in replies:
            resumer.fire(value)

    def _on_wake(self, _event: simpy.Event) -> None:
        self._waking = False
        self._next_step(self.env.now)

    def _next_step(self, now: float) -> None:
        """Plan the next step and schedule its end, or fall asleep until :meth:`_kick`.

        The scheduler is a chain of SimPy timeouts, one per step, each ending in
        :meth:`_end_step`, rather than a SimPy process: the same events at the same times,
        without resuming a generator for each.
        """
        self._asleep = False  # planning may free blocks, which kicks: nothing to wake
        plan = None if self.down or self.hung else self._plan(self.it, now)
        if plan is None:
            self._asleep = True
            return
        dt, chunks = plan
        self._step = (self.it, chunks, dt, self._generation)
        self.in_step = True
        self.env.timeout(dt).callbacks.append(self._step_end)

    def _end_step(self, _event: simpy.Event) -> None:
        step, chunks, dt, generation = self._step
        self.in_step = False
        now = self.env.now  # (a property call: read once a step, passed on)
        if generation == self._generation:  # else it crashed during the step
            self.steps += 1
            self.busy_s += dt
            self._apply(step, chunks, now)
        self._next_step(now)

    # ------------------------------------------------------------------ faults

    def crash(self) -> None:
        """The process dies: connections reset, KV and handoffs lost; refused until restart."""
        self.down = True
        seqs = list(self.seqs.values())
        replies: list[tuple[Resumer, object]] = []
        self._reset_state()
        for seq in seqs:
            seq.state = "gone"
            seq.run += 1
            if seq.reply is not None:
                replies.append((seq.reply, ConnectFailed("reset")))
            if seq.stream is not None:
                seq.stream.ended = "reset"
                self._wake.append(seq.stream)
        self.on_state(self, "crashed")
        self._flush(replies)
        self._kick()

    def restart(self) -> None:
        self.down = False
        self.on_state(self, self.condition())
        self._kick()

    def set_hung(self, hung: bool) -> None:
        self.hung = hung
        self.on_state(self, self.condition())
        self._kick()

    def set_slow(self, factor: float) -> None:
        self.slow = factor
        self.on_state(self, self.condition())

    def add_request_fault(self, kind: str, probability: float, after: int) -> None:
        self.request_faults.append((kind, probability, after))
        self.on_state(self, self.condition())

    def remove_request_fault(self, kind: str, probability: float, after: int) -> None:
        if (kind, probability, after) in self.request_faults:
            self.request_faults.remove((kind, probability, after))
        self.on_state(self, self.condition())

    def condition(self) -> str:
        """The engine's own condition, for the state timeline."""
        if self.down:
            return "crashed"
        if self.hung:
            return "hung"
        parts = [f"slow x{self.slow:g}"] if self.slow != 1.0 else []
        parts += sorted({kind for kind, _, _ in self.request_faults})
        return "+".join(parts) if parts else "up"
