"""The live client sink: the core's :class:`~narwhal.core.ports.ClientSink` over one aiohttp
request's response.

Rule kept here: the sink only writes what the core tells it to, in HTTP's order (one status and
head, then body bytes), within the deadline the core gives each write, and turns a departed
client into :class:`~narwhal.core.ports.ClientGone`; it decides nothing about statuses, content
or how long a client may take.

Theory of operation: :meth:`ResponseSink.respond` sends a complete JSON response (its head and body
in one send); :meth:`commit` fixes HTTP 200 with the SSE headers (the commit point: from then on
the response is a stream, whatever happens) and :meth:`send` streams body bytes after it;
:meth:`end` sends a stream's last bytes and ends its body in the same write, and :meth:`finish`
ends a committed body the core left open (the shutdown's terminal event). aiohttp holds a committed
head and sends it with the first body bytes (:class:`HeldHeadStream`), so the commit is one send
with the first token; a response that ends before any body write still gets its head
(:meth:`server_response`). aiohttp's ``write`` hands the bytes to the transport, then waits
(drains) while the connection's write buffer is over its high-water mark (the client is not
reading). That wait is bounded by the write's deadline with one :class:`WriteDeadline` per sink (a
:class:`~narwhal.live.waits.Deadline`: one loop timer, re-armed only when a write's deadline is
earlier than the armed one, so the router's own stalls do not count against the client and a write
costs a comparison and a few assignments). A write still waiting at its deadline is abandoned: the
timer marks the sink *cut* and aborts the connection, which ends aiohttp's wait (its bytes, and
whatever else the transport still held, are dropped: the client was not reading them), and the
write returns ``TimedOut``. No task is cancelled for it. After the cut every write returns
``TimedOut`` at once and :meth:`finish` writes nothing. :meth:`server_response` is what the handler
returns to aiohttp: for a response left incomplete (cut, or the client gone) the connection is
closed first, so aiohttp cannot end the body as if it were whole; it also disarms the sink's timer.
:meth:`finish` is bounded by the deadline of the last write (it ends that write's response). A
write to a closed connection raises ``ConnectionResetError``, which is ``ClientGone``. While the
core serves, :func:`run_with_disconnect` watches the connection's end (a future the edge resolves):
when the client leaves first it marks the sink gone and cancels the core's lifecycle, which
releases what it holds in ``finally``. A disconnect after the response was complete, or caused by
the sink's own cut, is not the client leaving and is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from narwhal.core.ports import ClientGone, Clock, TimedOut, WriteResult
from narwhal.core.stalls import StallLedger
from narwhal.live.clock import AnyioClock
from narwhal.live.waits import Deadline

T = TypeVar("T")

_TIMED_OUT = TimedOut()


class WriteDeadline(Deadline["ResponseSink"]):
    """Ends a write to the client still blocked at its deadline: the sink cuts its connection."""

    __slots__ = ()

    def expire(self, waiter: ResponseSink) -> None:
        waiter.cut_off()


class HeldHeadStream(StreamResponse):
    """A streamed response whose head aiohttp holds at ``prepare()`` and sends in the same
    transport write as the first body bytes (or the body's end), as it does for a complete
    :class:`~aiohttp.web.Response`; a plain ``StreamResponse`` sends its head alone."""

    _send_headers_immediately = False  # aiohttp's switch for this (Response sets it too)


class ResponseSink:
    """Writes one HTTP response to an aiohttp request, each write within its deadline."""

    def __init__(
        self,
        request: BaseRequest,
        extra_headers: dict[str, str] | None = None,
        *,
        clock: Clock | None = None,
        stalls: StallLedger | None = None,
    ) -> None:
        self._request = request
        self._extra = dict(extra_headers or {})
        self._timer = WriteDeadline(clock or AnyioClock(), stalls)
        self._response: StreamResponse | None = None
        self._stream: AbstractStreamWriter | None = None  # a committed response's writer
        self.gone = False
        self.cut = False  # a write timed out: nothing more is written
        self.started = False  # the status and head are fixed (a committed head may be held)
        self.finished = False  # the body's end was written
        self.status: int | None = None

    async def _emit(self, write: Awaitable[Any], deadline: float) -> WriteResult:
        """Await one write; ``TimedOut`` when it was still waiting at ``deadline``."""
        if self.gone:
            if asyncio.iscoroutine(write):
                write.close()
            raise ClientGone()
        if self.cut:
            if asyncio.iscoroutine(write):
                write.close()
            return _TIMED_OUT
        timer = self._timer
        timer.wait_begins(deadline, self)
        try:
            await write
        except OSError as error:
            if not self.cut:  # lost, not cut by the deadline
                self.gone = True
                raise ClientGone() from error
        finally:
            timer.waiter = None
        return _TIMED_OUT if self.cut else None

    async def respond(
        self,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float = math.inf,
    ) -> WriteResult:
        if self.started:
            raise RuntimeError("respond() after the response started")
        response = Response(
            status=status,
            body=json.dumps(body).encode(),
            headers={**self._extra, **headers, "content-type": "application/json"},
        )
        self._response, self.started, self.status = response, True, status
        if await self._emit(response.prepare(self._request), deadline) is not None:
            return _TIMED_OUT
        self.finished = True
        return await self._emit(response.write_eof(), deadline)

    async def commit(self, headers: dict[str, str], deadline: float = math.inf) -> WriteResult:
        if self.started:
            raise RuntimeError("commit() after the response started")
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        response = HeldHeadStream(status=200, headers={**self._extra, **headers})
        self._response, self.started, self.status = response, True, 200
        # the head is held, not written: nothing here waits on the client, and the first
        # send's deadline bounds the head with the bytes it goes out with
        self._stream = await response.prepare(self._request)
        return None

    async def send(self, data: bytes, deadline: float = math.inf) -> WriteResult:
        # _emit inlined: this runs once per streamed chunk
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        response = self._response
        assert response is not None, "send() before commit()"
        timer = self._timer
        timer.wait_begins(deadline, self)
        try:
            await response.write(data)
        except OSError:
            # aiohttp hands the data to the transport, then waits for it to drain: the
            # connection was lost during (or before) the wait, or the deadline cut it. A loss
            # cancels the request (run_with_disconnect); a later write raises ClientGone.
            if not self.cut:
                self.gone = True
        finally:
            timer.waiter = None
        return _TIMED_OUT if self.cut else None

    async def end(self, data: bytes, deadline: float = math.inf) -> WriteResult:
        """A committed stream's last bytes and its body's end, in one write (aiohttp puts the
        last chunk, the chunked terminator and a head still held in one transport write)."""
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        response = self._response
        assert response is not None, "end() before commit()"
        timer = self._timer
        timer.wait_begins(deadline, self)
        try:
            await response.write_eof(data)
        except OSError:
            if not self.cut:  # as in send: the loss cancels the request, a later write raises
                self.gone = True
        finally:
            timer.waiter = None
        if self.cut:
            return _TIMED_OUT
        self.finished = not self.gone
        return None

    async def finish(self, last: bytes = b"") -> None:
        """End a committed body, after ``last`` (no-op when the response is complete, never
        began, or was cut), within the deadline of the last write."""
        response = self._response
        if self.started and not self.finished and not self.gone and not self.cut:
            assert response is not None
            self.finished = True
            with contextlib.suppress(ClientGone):
                await self._emit(response.write_eof(last), self._timer.deadline)

    def cut_off(self) -> None:
        """The write in progress outlasted its deadline: cut the client off. Aborting the
        connection ends the write's wait (it returns, or fails with ``ConnectionResetError``),
        and the write then reports ``TimedOut``; the connection's end is not a disconnect."""
        self.cut = True
        transport = self._request.transport
        if transport is not None:
            transport.abort()

    def server_response(self) -> StreamResponse:
        """What the handler returns to aiohttp. A response not complete (cut, the client gone,
        or never begun) closes the connection first, after a committed head still held: aiohttp
        then writes nothing more."""
        self._timer.disarm()
        response = self._response
        if response is None or not self.finished or self.gone or self.cut:
            stream = self._stream
            if stream is not None and not self.gone and not self.cut:
                with contextlib.suppress(ConnectionError):
                    stream.send_headers()  # a head still held: the client sees the 200
            transport = self._request.transport
            if transport is not None:
                transport.close()
        return response if response is not None else Response(status=499)


async def run_with_disconnect(
    closed: asyncio.Future[None], sink: ResponseSink, work: Callable[[], Awaitable[T]]
) -> T | None:
    """Run ``work()``; cancel it when the connection closes first (then return None).

    No task of its own: the connection's end is a future, and a callback on it expires the
    ``asyncio.timeout`` scope ``work`` runs in (a scope with no deadline of its own), so asyncio
    itself tells that cancellation apart from any other (a shutdown's, which propagates)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:

            def on_close(_: asyncio.Future[None]) -> None:
                if not sink.finished and not sink.cut:  # a cut is the sink's own doing
                    sink.gone = True
                    scope.reschedule(loop.time())  # expire now: cancels ``work``

            closed.add_done_callback(on_close)
            try:
                return await work()
            finally:
                closed.remove_done_callback(on_close)
    except TimeoutError:
        if not scope.expired():
            raise  # not the scope's own
        return None
