"""The live clock: the core's :class:`~narwhal.core.ports.Clock` port over the OS clocks.

Rule kept here: core time is ``time.monotonic()`` (never jumps), and the wall clock is used only
to display times (``/status``, logs); :func:`to_wall` is the one conversion between them.

Theory of operation: deadlines handed to the transport are absolute monotonic times; the
transport turns them into relative anyio timeouts (``deadline - now()``). asyncio's own loop
clock is ``time.monotonic()`` too, so both agree, but nothing here depends on that.
"""

from __future__ import annotations

import asyncio
import time

import anyio

from narwhal.core.ports import ClientGone


class AnyioClock:
    """``now()`` monotonic seconds, ``wall()`` seconds since the epoch, ``sleep()`` via anyio."""

    # The OS clocks themselves (no Python frame around them: the core reads ``now()`` a few
    # times per streamed read).
    now = staticmethod(time.monotonic)
    wall = staticmethod(time.time)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(0.0, seconds))


def to_wall(clock: AnyioClock, t: float | None) -> float | None:
    """A monotonic time ``t`` on ``clock`` as seconds since the epoch (None stays None)."""
    if t is None:
        return None
    return clock.wall() - (clock.now() - t)


class EventWaiter:
    """A queued request's wait (the core's ``Waiter``) on the router's event loop. Given the
    request's connection-closed future, a client that leaves while queued ends the wait with
    ``ClientGone`` (the server's cancellation scope covers only serving)."""

    __slots__ = ("_event", "_gone")

    def __init__(self, closed: asyncio.Future[None] | None = None) -> None:
        self._event = asyncio.Event()
        self._gone = False
        if closed is not None:
            closed.add_done_callback(self._on_close)

    def _on_close(self, _: asyncio.Future[None]) -> None:
        if not self._event.is_set():  # dispatched first: serving's own scope takes over
            self._gone = True
            self._event.set()

    async def wait(self, deadline: float) -> bool:
        if not self._event.is_set():
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await self._event.wait()
        if self._gone:
            raise ClientGone()
        return self._event.is_set()

    def wake(self) -> None:
        self._event.set()
