"""What bounding one client write by its deadline costs, per write, for each way to do it.

The sink (:mod:`narwhal.live.sink`) bounds every write to the client, and a streamed response
is one write per chunk, so the bound's own cost is paid per chunk. This times, on uvloop, a
write that does not have to wait (the common case: the client reads) wrapped in each way to
bound it, against the bare write:

- ``abort``: what the sink does. One :class:`~narwhal.live.sink.WriteDeadline` per sink (one
  loop timer, re-armed only when a write's deadline is earlier than the armed one); at expiry it
  marks the sink cut and aborts the connection, so no task is cancelled. Per write: the
  deadline's bookkeeping and a flag test after the write.
- ``cancel``: the same shared timer, but expiry cancels the writing task, and each write
  records ``Task.cancelling()`` to tell the timer's cancellation apart from another's by
  ``uncancel`` (hand bookkeeping of asyncio's cancel counts).
- ``timeout_at``: ``asyncio.timeout_at`` around each write (asyncio's own cancel scope; exact,
  not extended by the router's stalls): a timer armed and cancelled per write.
- ``timeout_shared``: an ``asyncio.timeout(None)`` per write that the shared, stall-aware timer
  expires (what :func:`narwhal.live.waits.deadline_at` does for a one-off wait).
- ``sink.send``: the real :meth:`ResponseSink.send` over a response whose ``write`` returns at
  once (the ``abort`` path as shipped, with its checks).

It also times the per-request cancel scope that :class:`narwhal.live.sink.CancelledOnDisconnect`
opens (``anyio.CancelScope`` against ``asyncio.timeout(None)``).

Usage: ``.venv/bin/python benchmarks/write_deadlines.py [--writes N] [--repeats R]``; prints
nanoseconds of CPU per write (the best of R runs of N writes) and the overhead over the bare
write.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import uvloop

from narwhal.live.clock import AnyioClock
from narwhal.live.sink import ResponseSink
from narwhal.live.waits import Deadline

DATA = b"data: {}\n\n"
WRITE_TIMEOUT_S = 30.0


async def bare_write(data: bytes) -> None:
    """A write under the high-water mark: aiohttp's ``write`` returns without waiting."""


class _Cut:
    cut = False


class _AbortDeadline(Deadline[_Cut]):
    __slots__ = ()

    def expire(self, waiter: _Cut) -> None:
        waiter.cut = True


class _CancelDeadline(Deadline["asyncio.Task[Any]"]):
    __slots__ = ("expired",)

    def __init__(self, clock: AnyioClock) -> None:
        super().__init__(clock, None)
        self.expired = False

    def expire(self, waiter: asyncio.Task[Any]) -> None:
        self.expired = True
        waiter.cancel()


class _TimeoutDeadline(Deadline[asyncio.Timeout]):
    __slots__ = ()

    def expire(self, waiter: asyncio.Timeout) -> None:
        waiter.reschedule(asyncio.get_running_loop().time())


Loop = Callable[[int, AnyioClock], Coroutine[Any, Any, None]]


async def no_bound(n: int, clock: AnyioClock) -> None:
    for _ in range(n):
        await bare_write(DATA)


async def abort(n: int, clock: AnyioClock) -> None:
    timer, sink = _AbortDeadline(clock, None), _Cut()
    for _ in range(n):
        timer.wait_begins(clock.now() + WRITE_TIMEOUT_S, sink)
        try:
            await bare_write(DATA)
        except OSError:
            pass
        finally:
            timer.waiter = None
        if sink.cut:
            break
    timer.disarm()


async def cancel(n: int, clock: AnyioClock) -> None:
    timer = _CancelDeadline(clock)
    for _ in range(n):
        task = asyncio.current_task()
        assert task is not None
        timer.wait_begins(clock.now() + WRITE_TIMEOUT_S, task)
        cancelling = task.cancelling()
        try:
            await bare_write(DATA)
        except asyncio.CancelledError:
            if timer.expired and task.uncancel() <= cancelling:
                break
            raise
        finally:
            timer.waiter = None
    timer.disarm()


async def timeout_at(n: int, clock: AnyioClock) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(n):
        try:
            async with asyncio.timeout_at(loop.time() + WRITE_TIMEOUT_S):
                await bare_write(DATA)
        except TimeoutError:
            break


async def timeout_shared(n: int, clock: AnyioClock) -> None:
    timer = _TimeoutDeadline(clock, None)
    for _ in range(n):
        try:
            async with asyncio.timeout(None) as scope:
                timer.wait_begins(clock.now() + WRITE_TIMEOUT_S, scope)
                try:
                    await bare_write(DATA)
                finally:
                    timer.waiter = None
        except TimeoutError:
            break
    timer.disarm()


class _StubResponse:
    async def write(self, data: bytes) -> None:
        pass


class _StubRequest:
    transport = None


async def sink_send(n: int, clock: AnyioClock) -> None:
    sink = ResponseSink(_StubRequest(), clock=clock)  # type: ignore[arg-type]
    sink._response = _StubResponse()  # type: ignore[assignment]
    for _ in range(n):
        await sink.send(DATA, clock.now() + WRITE_TIMEOUT_S)
    sink._timer.disarm()


async def anyio_scope(n: int, clock: AnyioClock) -> None:
    for _ in range(n):
        with anyio.CancelScope():
            await bare_write(DATA)


async def asyncio_scope(n: int, clock: AnyioClock) -> None:
    for _ in range(n):
        async with asyncio.timeout(None):
            await bare_write(DATA)


WRITES: dict[str, Loop] = {
    "bare write": no_bound,
    "abort": abort,
    "cancel": cancel,
    "timeout_at": timeout_at,
    "timeout_shared": timeout_shared,
    "sink.send": sink_send,
}
SCOPES: dict[str, Loop] = {
    "no scope": no_bound,
    "anyio.CancelScope": anyio_scope,
    "asyncio.timeout(None)": asyncio_scope,
}


def best_ns(loop: Loop, n: int, repeats: int) -> float:
    clock = AnyioClock()
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time_ns()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(loop(n, clock))
        best = min(best, (time.process_time_ns() - started) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for title, table in (("per write", WRITES), ("per request (cancel scope)", SCOPES)):
        print(f"{title}: ns of CPU, best of {args.repeats} x {args.writes:,}")
        base = None
        for name, loop in table.items():
            ns = best_ns(loop, args.writes, args.repeats)
            base = ns if base is None else base
            print(f"  {name:<22} {ns:8.0f}  (+{ns - base:.0f})")


if __name__ == "__main__":
    main()
