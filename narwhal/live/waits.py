"""The deadlines of the live router's waits, kept on the time its event loop was running.

Rule kept here: a wait (an engine call, an open, a stream read; a write to the client) ends at
its deadline only once the router's own stalls since the wait began have been made up
(:meth:`narwhal.core.stalls.StallLedger.extended`); without a ledger a deadline is exact. A
wait that ends so is told apart from any other cancellation, which still propagates.

Why: after a stall, the event loop runs the timers that came due during it before it reads the
sockets (uvloop always does; asyncio wakes the reading task only after the timer's callback), so
an exact timer would end a wait whose reply is already in the socket and blame the engine (or
the client) for the router's lag.

Theory of operation: :class:`WaitTimer` serves a stream or a sink whose waits come one at a
time and often (one per chunk): :meth:`WaitTimer.begin` records the wait's deadline, the ledger's
stall total (the *mark*) and the waiting task, and arms one loop timer only when the deadline is
earlier than the one already armed. When the timer fires it re-arms itself for the wait's
deadline extended by the stalls since the mark if that is still ahead (or for a later deadline
a newer wait asked for), else it cancels the waiting task and flags it, so the wait's ``except
CancelledError`` can ask :meth:`WaitTimer.timed_out` whether the cancellation was the timer's
alone. So a stream costs about one timer per deadline period, not one per chunk.
:class:`DeadlineScope` is the same rule for a one-off wait: an anyio cancel scope that the timer
cancels (``cancelled_caught`` afterwards).
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType
from typing import Any

import anyio

from narwhal.core.ports import Clock
from narwhal.core.stalls import StallLedger


class WaitTimer:
    """Ends the one wait in progress on its owner once that wait's deadline has passed."""

    __slots__ = ("armed_at", "clock", "deadline", "expired", "handle", "mark", "stalls", "waiter")

    def __init__(self, clock: Clock, stalls: StallLedger | None) -> None:
        self.clock = clock
        self.stalls = stalls
        self.deadline = math.inf  # of the wait in progress (or the last one)
        self.mark = 0.0  # the ledger's stall total when that wait began
        self.handle: asyncio.TimerHandle | None = None  # armed for ``armed_at``
        self.armed_at = math.inf
        self.waiter: asyncio.Task[Any] | None = None  # the task blocked in the wait, if any
        self.expired = False  # the timer cancelled ``waiter``

    def begin(self, deadline: float) -> asyncio.Task[Any]:
        """A wait until ``deadline`` begins in the current task (returned); call :meth:`end`
        when it is over, and :meth:`timed_out` on a ``CancelledError``."""
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
        task = asyncio.current_task()
        assert task is not None  # a wait runs in a task
        self.waiter = task
        return task

    def end(self) -> None:
        self.waiter = None

    def timed_out(self, task: asyncio.Task[Any], cancelling: int) -> bool:
        """Whether the cancellation ``task`` got was this timer's and nobody else's
        (``cancelling``: ``task.cancelling()`` before the wait)."""
        if not self.expired:
            return False
        self.expired = False
        return task.uncancel() <= cancelling

    def disarm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.armed_at = math.inf

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
        self.expired = True
        waiter.cancel()


class DeadlineScope:
    """``with DeadlineScope(clock, stalls, deadline) as scope:`` — an anyio cancel scope
    cancelled at ``deadline`` extended by the stalls during it (exactly at it without a
    ledger); ``scope.cancelled_caught`` tells afterwards."""

    __slots__ = ("_clock", "_deadline", "_handle", "_mark", "_stalls", "scope")

    def __init__(self, clock: Clock, stalls: StallLedger | None, deadline: float) -> None:
        self._clock = clock
        self._stalls = stalls
        self._deadline = deadline
        self._mark = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self.scope = anyio.CancelScope()

    def __enter__(self) -> anyio.CancelScope:
        if self._stalls is not None:
            self._mark = self._stalls.total_s
        left = max(0.0, self._deadline - self._clock.now())
        self._handle = asyncio.get_running_loop().call_later(left, self._fire)
        return self.scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        return bool(self.scope.__exit__(exc_type, exc, tb))

    def _fire(self) -> None:
        self._handle = None
        now = self._clock.now()
        due = self._deadline
        if self._stalls is not None:
            due = self._stalls.extended(due, self._mark, now)
        if due > now:
            self._handle = asyncio.get_running_loop().call_later(due - now, self._fire)
            return
        self.scope.cancel()
