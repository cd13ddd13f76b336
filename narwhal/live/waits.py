"""The deadlines of the live router's waits, kept on the time its event loop was running.

Rule kept here: a wait (an engine call, an open, a stream read; a write to the client) ends at
its deadline only once the router's own stalls since the wait began have been made up
(:meth:`narwhal.core.stalls.StallLedger.extended`); without a ledger a deadline is exact. A
wait that ends so is told apart from any other cancellation, which still propagates.

Why: after a stall, the event loop runs the timers that came due during it before it reads the
sockets (uvloop always does; asyncio wakes the reading task only after the timer's callback), so
an exact timer would end a wait whose reply is already in the socket and blame the engine (or
the client) for the router's lag.

Theory of operation: a :class:`Deadline` serves waits that come one at a time, often (one per
streamed chunk): :meth:`Deadline.wait_begins` records the wait's deadline, the ledger's stall
total (the *mark*) and what is waiting (the *waiter*, None again once the wait ends), and arms
one loop timer only when the deadline is earlier than the one already armed. When the timer
fires it re-arms itself for the wait's deadline extended by the stalls since the mark if that is
still ahead (or for a later deadline a newer wait asked for), else it hands the waiter to
:meth:`Deadline.expire`, which ends the wait in the waiter's own way. So a stream costs about
one timer per deadline period, not one per chunk, and nothing per chunk but a comparison and
four assignments.

The ways to end a wait:

- :class:`ReadDeadline` ends a wait for an engine's response (its head, its body, a stream's
  next chunk) by setting :class:`DeadlinePassed` on its connection
  (:class:`narwhal.live.h1client.H1Connection`): the wait raises it, and no task is cancelled
  (a call or stream whose wait timed out is over, so poisoning its connection loses nothing).
- :func:`deadline_at` is the same rule for a wait not on a connection (for one to open, or for
  room in the pool): an
  ``asyncio.timeout`` with no deadline of its own that the timer expires, so the block raises
  ``TimeoutError`` and asyncio tells its cancellation apart from anyone else's (without a
  ledger, a plain ``asyncio.timeout`` for the deadline).
- :class:`narwhal.live.sink.WriteDeadline` ends a write to the client by cutting the client's
  connection (the blocked write returns or fails, and the sink reports ``TimedOut``).

None of them cancels a task by hand, so none has to tell its cancellation apart from another's
(no ``uncancel``): a task is cancelled only by a scope (``asyncio.timeout``, anyio's task groups
and scopes) and by whoever owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from types import TracebackType
from typing import Generic, Protocol, TypeVar

from narwhal.core.ports import Clock
from narwhal.core.stalls import StallLedger

W = TypeVar("W")


class DeadlinePassed(Exception):
    """A read's deadline passed (set on the stream's reader by :class:`ReadDeadline`)."""


class Deadline(Generic[W]):
    """One loop timer for a sequence of waits; ends the wait in progress at its deadline."""

    __slots__ = ("armed_at", "clock", "deadline", "handle", "mark", "stalls", "waiter")

    def __init__(self, clock: Clock, stalls: StallLedger | None) -> None:
        self.clock = clock
        self.stalls = stalls
        self.deadline = math.inf  # of the wait in progress (or the last one)
        self.mark = 0.0  # the ledger's stall total when that wait began
        self.handle: asyncio.TimerHandle | None = None  # armed for ``armed_at``
        self.armed_at = math.inf
        self.waiter: W | None = None  # what the wait in progress waits in (None: no wait)

    def wait_begins(self, deadline: float, waiter: W) -> None:
        """A wait until ``deadline`` begins in ``waiter``; set ``waiter`` to None when it ends
        (an assignment, not a call: a stream ends a wait per chunk)."""
        self.deadline = deadline
        if self.stalls is not None:
            self.mark = self.stalls.total_s
        if deadline < self.armed_at:  # a later timer re-arms itself when it fires
            if self.handle is not None:
                self.handle.cancel()
            self.armed_at = deadline
            self.handle = asyncio.get_running_loop().call_later(
                max(0.0, deadline - self.clock.now()), self._fire
            )
        self.waiter = waiter

    def disarm(self) -> None:
        """No more waits: cancel the timer."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.armed_at = math.inf
        self.waiter = None

    def expire(self, waiter: W) -> None:
        """End the wait in progress in ``waiter`` (its deadline has passed)."""
        raise NotImplementedError

    def _fire(self) -> None:
        self.handle = None
        self.armed_at = math.inf
        waiter = self.waiter
        if waiter is None:
            return  # no wait in progress: the next one arms the timer again
        now = self.clock.now()
        due = self.deadline
        if self.stalls is not None:
            due = self.stalls.extended(due, self.mark, now)
        if due > now:
            self.armed_at = due
            self.handle = asyncio.get_running_loop().call_later(due - now, self._fire)
            return
        self.waiter = None
        self.expire(waiter)


class Readable(Protocol):
    """What a stream is read from: a failure set on it ends the read in progress."""

    def set_exception(self, error: BaseException) -> None: ...


class ReadDeadline(Deadline[Readable]):
    """Ends a wait on an engine's connection: the wait raises :class:`DeadlinePassed`."""

    __slots__ = ()

    def expire(self, waiter: Readable) -> None:
        waiter.set_exception(DeadlinePassed())


class _TimeoutDeadline(Deadline[asyncio.Timeout]):
    """:func:`deadline_at` with a ledger: an ``asyncio.timeout`` with no deadline of its own,
    which this timer expires."""

    __slots__ = ("at", "timeout")

    def __init__(self, clock: Clock, stalls: StallLedger, deadline: float) -> None:
        super().__init__(clock, stalls)
        self.at = deadline
        self.timeout = asyncio.timeout(None)

    async def __aenter__(self) -> None:
        await self.timeout.__aenter__()
        self.wait_begins(self.at, self.timeout)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.disarm()
        await self.timeout.__aexit__(exc_type, exc, tb)

    def expire(self, waiter: asyncio.Timeout) -> None:
        waiter.reschedule(asyncio.get_running_loop().time())  # expire it now


def deadline_at(
    clock: Clock, stalls: StallLedger | None, deadline: float
) -> contextlib.AbstractAsyncContextManager[object]:
    """``async with deadline_at(clock, stalls, deadline):`` — the block raises
    ``TimeoutError`` at ``deadline`` extended by the stalls during it (exactly at it without a
    ledger); any other cancellation propagates. With a ledger the expiry takes effect at the
    loop's next turn (``Timeout.reschedule`` to now), which only errs the router's way."""
    if stalls is None:
        return asyncio.timeout(max(0.0, deadline - clock.now()))
    return _TimeoutDeadline(clock, stalls, deadline)
