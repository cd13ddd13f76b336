"""The live client sink: the core's :class:`~narwhal.core.ports.ClientSink` over ASGI ``send``.

Rule kept here: the sink only writes what the core tells it to, in ASGI's order (one
``http.response.start``, then body messages), within the deadline the core gives each write,
and turns a departed client into :class:`~narwhal.core.ports.ClientGone`; it decides nothing
about statuses, content or how long a client may take.

Theory of operation: :meth:`AsgiSink.respond` sends a complete JSON response; :meth:`commit`
sends HTTP 200 with the SSE headers (the commit point) and :meth:`send` streams body bytes after
it; :meth:`finish` ends a committed body. uvicorn's ``send`` waits while the connection's write
buffer is over its high-water mark (the client is not reading); that wait is bounded by the
write's deadline with a :class:`~narwhal.live.waits.WaitTimer` (so the router's own stalls do
not count against the client either). A write still waiting at its deadline is abandoned, whole
(uvicorn writes nothing of a message before the wait ends), and returns ``TimedOut``; the sink is
then *cut*: every later write returns ``TimedOut`` at once and :meth:`finish` writes nothing, so
the app returns with the response incomplete and uvicorn closes the connection. :meth:`finish`
is bounded by the deadline of the last write (it ends that write's response). A watcher (see
:func:`run_with_disconnect`) reads ``receive()`` concurrently; on ``http.disconnect`` it marks
the sink gone and cancels the request's scope, so the core's lifecycle is cancelled and releases
what it holds in ``finally``. A disconnect reported after the response was complete is normal
and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Receive, Send

from narwhal.core.ports import ClientGone, Clock, TimedOut, WriteResult
from narwhal.core.stalls import StallLedger
from narwhal.live.clock import AnyioClock
from narwhal.live.waits import WaitTimer

T = TypeVar("T")


def _header_list(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


_TIMED_OUT = TimedOut()


class AsgiSink:
    """Writes one HTTP response to an ASGI ``send``, each write within its deadline."""

    def __init__(
        self,
        send: Send,
        extra_headers: dict[str, str] | None = None,
        *,
        clock: Clock | None = None,
        stalls: StallLedger | None = None,
    ) -> None:
        self._send = send
        self._extra = dict(extra_headers or {})
        self._timer = WaitTimer(clock or AnyioClock(), stalls)
        self.gone = False
        self.cut = False  # a write timed out: nothing more is written
        self.started = False  # http.response.start sent
        self.finished = False  # the last body message sent
        self.status: int | None = None

    async def _emit(self, message: dict[str, Any], deadline: float) -> WriteResult:
        """Send one ASGI message; ``TimedOut`` when it was still waiting at ``deadline``."""
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        timer = self._timer
        task = timer.begin(deadline)
        cancelling = task.cancelling()
        try:
            await self._send(message)
        except OSError as error:
            self.gone = True
            raise ClientGone() from error
        except asyncio.CancelledError:
            if timer.timed_out(task, cancelling):  # our timer's, and nobody else's
                self.cut = True
                timer.disarm()
                return _TIMED_OUT
            raise
        finally:
            timer.end()
        return None

    async def respond(
        self,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float = math.inf,
    ) -> WriteResult:
        if self.started:
            raise RuntimeError("respond() after the response started")
        payload = json.dumps(body).encode()
        all_headers = {
            **self._extra,
            **headers,
            "content-type": "application/json",
            "content-length": str(len(payload)),
        }
        self.started, self.status = True, status
        start = {
            "type": "http.response.start",
            "status": status,
            "headers": _header_list(all_headers),
        }
        if await self._emit(start, deadline) is not None:
            return _TIMED_OUT
        self.finished = True
        return await self._emit(
            {"type": "http.response.body", "body": payload, "more_body": False}, deadline
        )

    async def commit(self, headers: dict[str, str], deadline: float = math.inf) -> WriteResult:
        if self.started:
            raise RuntimeError("commit() after the response started")
        self.started, self.status = True, 200
        return await self._emit(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _header_list({**self._extra, **headers}),
            },
            deadline,
        )

    async def send(self, data: bytes, deadline: float = math.inf) -> WriteResult:
        # _emit inlined: this runs once per streamed chunk
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        timer = self._timer
        task = timer.begin(deadline)
        cancelling = task.cancelling()
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
        except OSError as error:
            self.gone = True
            raise ClientGone() from error
        except asyncio.CancelledError:
            if timer.timed_out(task, cancelling):
                self.cut = True
                timer.disarm()
                return _TIMED_OUT
            raise
        finally:
            timer.waiter = None
        return None

    async def finish(self) -> None:
        """End a committed body (no-op when the response is complete, never began, or was cut),
        within the deadline of the last write."""
        if self.started and not self.finished and not self.gone and not self.cut:
            self.finished = True
            with contextlib.suppress(ClientGone):
                end = {"type": "http.response.body", "body": b"", "more_body": False}
                await self._emit(end, self._timer.deadline)


async def run_with_disconnect(
    receive: Receive, sink: AsgiSink, work: Callable[[], Awaitable[T]]
) -> T | None:
    """Run ``work()``; cancel it when the client disconnects first (then return None)."""
    result: list[T] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not sink.finished:
                        sink.gone = True
                        group.cancel_scope.cancel()
                    return

        group.start_soon(watch)
        result.append(await work())
        group.cancel_scope.cancel()
    return result[0] if result else None
