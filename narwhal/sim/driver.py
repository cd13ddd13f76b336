"""The simulation's ports: Clock, Transport, ClientSink and spawn over SimPy, and the stepper
that runs the core's coroutines (``serve_request``, ``maintenance_loop``) unchanged.

Rule kept here: this module translates, it never decides. Every port call becomes engine work
or SimPy events; every deadline the core passes is honoured exactly (absolute ``env.now``
values); no placement, retry, breaker or timeout policy lives here.

Theory of operation: a core coroutine awaits only objects returned by these ports. A port call
whose answer is already known (a stream's buffered bytes, an open that the engine answers at
once, a client write) returns a *ready* awaitable that completes without suspending. Otherwise
it returns an *op* whose ``__await__`` does ``result = yield self; return result``. A
:class:`Task` steps the coroutine: ``op = coro.send(value)``, then ``op.start(task)`` either
gives a value at once (the loop continues) or registers the task to be resumed later (by a
SimPy event callback for sleeps and deadlines, or by an engine step that produced the awaited
bytes) with :meth:`Wait.fire`; whichever of result and deadline comes first wins, the other is
ignored. A task is thus a light SimPy process: it costs no event of its own per resume, which is
what keeps the simulation at one event per engine iteration rather than one per token.

Deadlines share one SimPy timer (:class:`Deadlines`): a heap of pending deadlines, the timer
armed at the earliest one still pending. Most deadlines are never reached (the call returns, the
chunk arrives), so they cost a heap entry, not a SimPy event. A stream's deadline is lazy as
well: when the entry comes due and the router has meanwhile moved its deadline later (a chunk
arrived), the stream gets a new entry at the new deadline instead of firing; once the stream is
closed its entry stops mattering (without that, nearly every request cost the timer one event).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol

import simpy

from narwhal.core.ports import (
    CallResult,
    ChunkResult,
    OpenResult,
    Ports,
    Relay,
    TimedOut,
)
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.sequence import Seq, SimStream, take_chunk

PENDING: Any = object()  # op.start() result: the task will be resumed later
EPOCH = 1_767_225_600.0  # wall() of simulated time 0 (2026-01-01T00:00:00Z), display only
_TIMED_OUT = TimedOut()


class Ready:
    """An awaitable whose value is already known: awaiting it does not suspend the task."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, Any, Any]:
        return self.value
        yield  # pragma: no cover - makes this a generator


READY_NONE = Ready(None)


class Op:
    """A request to the driver: yielded to the :class:`Task`, which puts the answer in
    ``result`` and then resumes the coroutine with ``None``.

    Why not ``send(answer)``: each coroutine between the task and the op passes the value on to
    the one it awaits, and a compiled coroutine steps its inner one with a plain ``next`` for
    ``None`` (its fast path) but with a ``send`` looked up by name for anything else.
    """

    __slots__ = ("result",)

    result: Any

    def __await__(self) -> Generator[Any, Any, Any]:
        yield self
        return self.result

    def start(self, task: Task) -> Any:
        """Begin the operation: return its result now, or :data:`PENDING`."""
        raise NotImplementedError


class Task:
    """Steps one core coroutine; resumed by whatever satisfies the op it waits on."""

    __slots__ = ("coro", "on_done", "waiting_on")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], on_done: Callable[[Any], None] | None = None
    ) -> None:
        self.coro: Coroutine[Any, Any, Any] | None = coro
        self.on_done = on_done
        self.waiting_on: Op | None = None  # the op whose answer resumes this task

    def resume(self, value: Any = None) -> None:
        """Answer the op the task waits on with ``value`` and step it until it waits again."""
        coro = self.coro
        if coro is None:
            raise RuntimeError("resumed a task that has finished")
        waiting = self.waiting_on
        if waiting is not None:
            waiting.result = value
            self.waiting_on = None
        while True:
            try:
                op: Op = coro.send(None)  # (the answer is in op.result: see Op)
            except StopIteration as stop:
                # Let go of the finished coroutine now: a compiled one keeps its locals (the
                # whole request) until freed, and stale deadlines still point at this task.
                self.coro = None
                if self.on_done is not None:
                    self.on_done(stop.value)
                return
            result = op.start(self)
            if result is PENDING:
                self.waiting_on = op
                return
            op.result = result


class Wait:
    """One pending op of one task: the first :meth:`fire` resumes the task, later ones are
    ignored (result versus deadline)."""

    __slots__ = ("done", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.done = False

    def fire(self, value: object) -> None:
        if not self.done:
            self.done = True
            self.task.resume(value)


# ---------------------------------------------------------------- deadlines


class Deadline(Protocol):
    """Something waiting for a deadline (a call, a stream read)."""

    def pending(self, at: float) -> bool:
        """Whether the deadline ``at`` still matters (the wait it bounds is not over)."""
        ...

    def expire(self, at: float) -> None:
        """The deadline ``at`` is reached."""
        ...


class Deadlines:
    """Pending deadlines on one SimPy timer, armed at the earliest still pending one.

    Deadlines that are due together expire in the order they were added; one that stopped
    mattering is dropped when it reaches the head of the heap.
    """

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.heap: list[tuple[float, int, Deadline]] = []
        self.added = 0
        self.timer: simpy.Event | None = None
        self.timer_at = float("inf")

    def add(self, at: float, deadline: Deadline) -> None:
        heapq.heappush(self.heap, (at, self.added, deadline))
        self.added += 1
        if at < self.timer_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        self.timer_at = at
        timer = self.env.timeout(at - self.env.now)
        timer.callbacks.append(self._on_timer)
        self.timer = timer

    def _on_timer(self, event: simpy.Event) -> None:
        if event is not self.timer:
            return  # superseded by an earlier deadline armed after it
        self.timer, self.timer_at = None, float("inf")
        heap, now = self.heap, self.env.now
        while heap and heap[0][0] <= now:
            at, _, deadline = heapq.heappop(heap)
            if deadline.pending(at):
                deadline.expire(at)
        while heap and not heap[0][2].pending(heap[0][0]):
            heapq.heappop(heap)
        if heap and heap[0][0] < self.timer_at:
            self._arm(heap[0][0])


# ---------------------------------------------------------------- Clock


class _SleepOp(Op):
    __slots__ = ("clock", "seconds")

    def __init__(self, clock: SimClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds

    def start(self, task: Task) -> Any:
        timer = self.clock.env.timeout(max(0.0, self.seconds))
        timer.callbacks.append(lambda _event: task.resume(None))
        return PENDING


class SimClock:
    """Simulated time: ``now()`` is ``env.now``."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def now(self) -> float:
        return float(self.env.now)

    def wall(self) -> float:
        return EPOCH + float(self.env.now)

    def sleep(self, seconds: float) -> _SleepOp:
        return _SleepOp(self, seconds)


class _WakeOp(Op):
    __slots__ = ("deadline", "waiter")

    def __init__(self, waiter: SimWaiter, deadline: float) -> None:
        self.waiter = waiter
        self.deadline = deadline

    def start(self, task: Task) -> Any:
        waiter = self.waiter
        if waiter.woken:
            return True
        wait = waiter.pending = Wait(task)
        env = waiter.env
        timer = env.timeout(max(0.0, self.deadline - env.now))
        timer.callbacks.append(lambda _event: wait.fire(False))
        return PENDING


class SimWaiter:
    """A queued request's wait (the core's ``Waiter``): woken on a fresh SimPy event, never
    inside the step of the task that woke it."""

    __slots__ = ("env", "pending", "woken")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.woken = False
        self.pending: Wait | None = None

    def wait(self, deadline: float) -> _WakeOp:
        return _WakeOp(self, deadline)

    def wake(self) -> None:
        self.woken = True
        pending, self.pending = self.pending, None
        if pending is not None:
            self.env.timeout(0).callbacks.append(lambda _event: pending.fire(True))


# ---------------------------------------------------------------- Transport


class _CallDeadline:
    """A pending engine call's deadline: the router hangs up and the engine drops the request."""

    __slots__ = ("engine", "seq", "wait")

    def __init__(self, engine: SimEngine, seq: Seq, wait: Wait) -> None:
        self.engine = engine
        self.seq = seq
        self.wait = wait

    def pending(self, at: float) -> bool:
        return not self.wait.done

    def expire(self, at: float) -> None:
        self.engine.abort(self.seq)
        self.wait.fire(_TIMED_OUT)


class _StreamDeadline:
    """A stream read's deadline (lazy: re-added at the router's later deadline if it moved)."""

    __slots__ = ("stream", "transport")

    def __init__(self, transport: SimTransport, stream: SimStream) -> None:
        self.transport = transport
        self.stream = stream

    def pending(self, at: float) -> bool:
        return self.stream.timer_at == at

    def expire(self, at: float) -> None:
        self.transport.on_deadline(self.stream)


class _CallOp(Op):
    __slots__ = ("args", "deadline", "engine", "transport")

    def __init__(
        self, transport: SimTransport, engine: SimEngine, args: tuple[Any, ...], deadline: float
    ) -> None:
        self.transport = transport
        self.engine = engine
        self.args = args
        self.deadline = deadline

    def start(self, task: Task) -> Any:
        env = self.transport.env
        if self.deadline <= env.now:
            return _TIMED_OUT
        wait = Wait(task)
        method, path, body, headers = self.args
        result = self.engine.call(method, path, body, headers, wait)
        if not isinstance(result, Seq):
            return result
        self.transport.deadlines.add(self.deadline, _CallDeadline(self.engine, result, wait))
        return PENDING


class _ChunkOp(Op):
    __slots__ = ("deadline", "stream", "transport")

    def __init__(self, transport: SimTransport, stream: SimStream, deadline: float) -> None:
        self.transport = transport
        self.stream = stream
        self.deadline = deadline

    def start(self, task: Task) -> Any:
        stream, env = self.stream, self.transport.env
        if self.deadline <= env.now:
            return _TIMED_OUT
        wait = Wait(task)
        stream.waiter = wait
        stream.deadline = self.deadline
        if stream.timer_at < 0 or stream.timer_at > self.deadline:
            self.transport.arm(stream, self.deadline)
        return PENDING


class SimTransport:
    """Engine calls over the simulated fleet (URL -> :class:`SimEngine`)."""

    def __init__(self, env: simpy.Environment, engines: dict[str, SimEngine]) -> None:
        self.env = env
        self.engines = engines
        self.deadlines = Deadlines(env)

    def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> _CallOp:
        return _CallOp(self, self.engines[url], (method, path, body, headers), deadline)

    def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> Ready:
        if deadline <= self.env.now:
            return Ready(_TIMED_OUT)
        result: OpenResult = self.engines[url].open_stream(path, body, headers)
        return Ready(result)

    def next_chunk(self, handle: Any, deadline: float) -> Ready | _ChunkOp:
        stream: SimStream = handle
        if stream.chunks or stream.ended is not None:
            return Ready(take_chunk(stream))
        return _ChunkOp(self, stream, deadline)

    def relay_reads(self, handle: Any, relay: Relay) -> bool:
        return False  # a simulated read costs no CPU: every read goes through next_chunk

    def close_stream(self, handle: Any) -> None:
        if handle is None:
            return
        stream: SimStream = handle
        stream.waiter = None
        stream.timer_at = -1.0  # its pending deadline, if any, no longer matters
        stream.engine.close_stream(stream)

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        engine = self.engines.get(producer_url)
        if engine is not None:
            engine.release_handoff(descriptor)

    def arm(self, stream: SimStream, at: float) -> None:
        """(Re)arm the stream's deadline to come due at ``at`` (an earlier one supersedes)."""
        stream.timer_at = at
        self.deadlines.add(at, _StreamDeadline(self, stream))

    def on_deadline(self, stream: SimStream) -> None:
        """The stream's armed deadline came due: time out its read, or re-arm if it moved."""
        stream.timer_at = -1.0
        wait = stream.waiter
        if wait is None:
            return
        if self.env.now >= stream.deadline:
            stream.waiter = None
            held = take_chunk(stream)  # chunks held back for this wake-up, if any
            wait.fire(held if held is not None else _TIMED_OUT)
        else:
            self.arm(stream, stream.deadline)


# ---------------------------------------------------------------- client sink and spawn


class SimSink:
    """The simulated client: it reads everything at once (no write ever waits, so none reaches
    its deadline) and never goes away."""

    __slots__ = ()

    def respond(
        self, status: int, body: dict[str, Any], headers: dict[str, str], deadline: float
    ) -> Ready:
        return READY_NONE

    def commit(self, headers: dict[str, str], deadline: float) -> Ready:
        return READY_NONE

    def send(self, data: bytes, deadline: float) -> Ready:
        return READY_NONE

    def send_now(self, data: bytes) -> bool:
        return True

    def end(self, data: bytes, deadline: float) -> Ready:
        return READY_NONE


SINK = SimSink()


def make_ports(env: simpy.Environment, engines: dict[str, SimEngine]) -> Ports:
    """The ports a core coroutine needs, over ``env`` and the simulated fleet."""

    def spawn(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        # the coroutine is made when it starts: one the run ends before is never created
        env.timeout(0).callbacks.append(lambda _event: Task(factory()).resume(None))

    return Ports(
        clock=SimClock(env),
        transport=SimTransport(env, engines),
        spawn=spawn,
        waiter=lambda: SimWaiter(env),
    )


def start(
    env: simpy.Environment,
    coro: Coroutine[Any, Any, Any],
    on_done: Callable[[Any], None] | None = None,
) -> Task:
    """Run ``coro`` from now on (its first step happens at once)."""
    task = Task(coro, on_done)
    task.resume(None)
    return task


__all__ = [
    "SINK",
    "CallResult",
    "ChunkResult",
    "Ready",
    "SimClock",
    "SimSink",
    "SimTransport",
    "Task",
    "make_ports",
    "start",
]
