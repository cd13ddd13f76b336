"""One request inside a simulated engine (a :class:`Seq`) and the stream its output goes to.

Rule kept here: a sequence's state says which of the scheduler's collections holds it, and
nothing else does (vLLM's ``Request`` and ``RequestStatus``, ``vllm/v1/request.py``). Every
transition is made by the scheduler (:mod:`narwhal.sim.gpu.scheduler`) or by the engine's
HTTP surface on an abort.

Theory of operation: a sequence waits (``WAITING``), is admitted with KV blocks and then either
prefills (``PREFILL``) or, as a decode leg whose KV lives on a producer, pulls it
(``TRANSFER``, then ``PULLED`` until the batch has room for it, as vLLM's
``WAITING_FOR_REMOTE_KVS`` requests wait outside its running list); it then decodes (``DECODE``)
until it finishes (``FINISHED``). Preemption takes a decode out of the batch (``LEFT``), or a
prefill out of the prefilling list, and back to ``WAITING``; a stall fault leaves it
``STALLED`` (its stream open and silent) until the router aborts it. ``run`` counts the times
it left the batch: entries the scheduler filed under an older ``run`` are stale and skipped.

A :class:`SimStream` is the open decode stream as the router's transport sees it: the bytes the
engine produced and the router has not read yet, each with its arrival time.
"""

from __future__ import annotations

import enum
from typing import Any, Final, Protocol

from narwhal.core.ports import Burst, ChunkResult, ConnectFailed, StreamEnd
from narwhal.core.wire import ChunkWriter
from narwhal.engines.block_pool import BlockKey


class SeqState(enum.Enum):
    """Where a sequence is in the engine."""

    WAITING = "waiting"  # in the FCFS queue (new, or preempted and back at its head)
    PREFILL = "prefill"  # admitted with blocks: its prompt (plus any output) is prefilled
    TRANSFER = "transfer"  # admitted remote decode: its KV is being pulled from the producer
    PULLED = "pulled"  # its KV arrived: it waits for a place in the batch (the sequence cap)
    DECODE = "decode"  # in the decode batch: one token per step
    LEFT = "left"  # just taken out of the decode batch (preempted, finishing or stalling)
    STALLED = "stalled"  # a stall fault: the stream stays open and says nothing more
    FINISHED = "finished"  # done, aborted or lost in a crash: holds nothing


# The states by their names, which the engine's modules use: on Python 3.11 reading an attribute
# of an Enum class goes through a Python-level hook (EnumType.__getattr__), on every state test.
WAITING: Final = SeqState.WAITING
PREFILL: Final = SeqState.PREFILL
TRANSFER: Final = SeqState.TRANSFER
PULLED: Final = SeqState.PULLED
DECODE: Final = SeqState.DECODE
LEFT: Final = SeqState.LEFT
STALLED: Final = SeqState.STALLED
FINISHED: Final = SeqState.FINISHED


class Resumer(Protocol):
    """The router side of a pending call: fired once with the call's result."""

    def fire(self, value: object) -> None: ...


class StreamCloser(Protocol):
    """The engine that owns a stream: the transport closes a stream through it."""

    def close_stream(self, stream: SimStream) -> None: ...


class Ending(enum.Enum):
    """How a stream ended, once it has."""

    EOF = "eof"  # a clean close (after [DONE], or a disconnect fault's close before it)
    RESET = "reset"  # the connection was reset (the engine crashed)


EOF: Final = Ending.EOF  # (module constants, as the states above)
RESET: Final = Ending.RESET


class SimStream:
    """An open decode stream: bytes the engine produced and the router has not read yet."""

    __slots__ = ("chunks", "deadline", "ended", "engine", "seq", "timer_at", "times", "waiter")

    def __init__(self, engine: StreamCloser) -> None:
        self.engine = engine
        self.seq: Seq | None = None
        # the writes not read yet, oldest first: their arrival times and their bytes, side by
        # side rather than as pairs, so that a held write makes no object the cyclic garbage
        # collector must track (at one token per chunk, one a token, held for seconds)
        self.times: list[float] = []
        self.chunks: list[bytes] = []
        self.waiter: Resumer | None = None  # set by the transport while the router waits
        self.deadline = 0.0  # the waiter's deadline (the transport's lazy timer reads it)
        self.timer_at = -1.0  # when the transport's pending deadline timer fires (-1: none)
        self.ended: Ending | None = None

    def write(self, at: float, data: bytes) -> None:
        """The engine wrote ``data`` at ``at``."""
        self.times.append(at)
        self.chunks.append(data)

    def held(self) -> list[tuple[float, bytes]]:
        """The writes not read yet, as ``(arrival time, bytes)``, oldest first."""
        return list(zip(self.times, self.chunks, strict=True))


def take_chunk(stream: SimStream) -> ChunkResult | None:
    """What a read of ``stream`` returns now, or None when the router must wait."""
    if stream.chunks:
        burst = Burst(stream.times, stream.chunks)  # handed over whole, not copied
        stream.times, stream.chunks = [], []
        return burst
    if stream.ended is None:
        return None
    return ConnectFailed("reset") if stream.ended is RESET else StreamEnd()


class Seq:
    """One request inside an engine (a prefill leg or a decode leg)."""

    __slots__ = (
        "blocks",
        "c0",
        "cached",
        "chat",
        "chunk",
        "chunk_tokens",
        "emitted",
        "fault",
        "gen",
        "head",
        "id",
        "ids",
        "j",
        "keys",
        "need",
        "out",
        "prefilled",
        "prompt",
        "queued_at",
        "registered",
        "remote",
        "reply",
        "resumed",
        "rid",
        "run",
        "state",
        "stream",
    )

    def __init__(self, sid: int, rid: str, prompt: int, out: int) -> None:
        self.id = sid
        self.rid = rid  # the request id (X-Request-Id), in its response ids
        self.prompt = prompt  # prompt tokens
        self.out = out  # tokens to generate (max_tokens)
        self.gen = 0  # tokens generated so far (while decoding: as of the join step)
        self.emitted = 0  # tokens sent to the stream
        self.need = prompt  # tokens to prefill (0 for a remote decode after its pull)
        self.prefilled = 0
        self.blocks: list[int] = []  # its KV block ids
        # prefix caching: the keys of its prompt's full blocks (None: no content identity), how
        # many of its blocks are registered in the cache, and the prompt tokens its last
        # admission found cached
        self.keys: list[BlockKey] | None = None
        self.registered = 0
        self.cached = 0
        self.resumed = False  # preempted once: vLLM's prefix-cache counters leave it out
        self.queued_at = 0.0  # when it joined a queue the scheduler admits from (async rule)
        self.run = 0  # bumped whenever the sequence leaves the batch: stale bucket entries skip
        self.j = 0  # step at which it joined the decode batch
        self.c0 = 0  # its context at that step
        self.state: SeqState = WAITING
        self.reply: Resumer | None = None  # prefill leg: the pending call
        self.stream: SimStream | None = None  # decode leg
        self.remote: dict[str, Any] | None = None  # decode leg: the descriptor to pull
        self.fault: tuple[str, int] | None = None  # (stream fault kind, after this many tokens)
        self.chat = False  # a chat completion (its chunks carry a delta)
        self.head: ChunkWriter | None = None  # decode leg: the writer of its stream's chunks
        self.chunk = b""  # the bytes of the last non-final chunk, for ``chunk_tokens`` tokens
        self.chunk_tokens = 0
        # decode leg: the body of a request that asked for return_token_ids (None: it did not),
        # its prompt's ids read from it on the first chunk
        self.ids: dict[str, Any] | None = None
