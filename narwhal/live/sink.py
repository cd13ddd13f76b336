"""The live client sink: the core's :class:`~narwhal.core.ports.ClientSink` over one request's
response at the router's edge (:class:`narwhal.live.h1request.EdgeRequest`).

Rule kept here: the sink only writes what the core tells it to, in HTTP's order (one status and
head, then body bytes), within the deadline the core gives each write, and turns a departed
client into :class:`~narwhal.core.ports.ClientGone`; it decides nothing about statuses, content
or how long a client may take.

Theory of operation: :meth:`ResponseSink.respond` sends a complete JSON response (its head and
body in one send); :meth:`commit` fixes HTTP 200 with the SSE headers (the commit point: from
then on the response is a stream, whatever happens) and :meth:`send` streams body bytes after it;
:meth:`end` sends a stream's last bytes and ends its body in the same write, and :meth:`finish`
ends a committed body the core left open (the shutdown's terminal event). The committed head is
held and sent with the first body bytes, so the commit is one send with the first token; a
response that ends before any body write still gets its head (:meth:`done`). Each write hands
its bytes to the transport at once; only while the connection's write buffer is over its
high-water mark (the client is not reading) does it wait (drain). That wait is bounded by the
write's deadline with one :class:`WriteDeadline` per sink (a
:class:`~narwhal.live.waits.Deadline`: one loop timer, re-armed only when a write's deadline is
earlier than the armed one, so the router's own stalls do not count against the client; a write
that does not wait does not touch it). A write still waiting at its deadline is abandoned: the
timer marks the sink *cut* and aborts the connection, which ends the wait (its bytes, and
whatever else the transport still held, are dropped: the client was not reading them), and the
write returns ``TimedOut``. No task is cancelled for it. After the cut every write returns
``TimedOut`` at once and :meth:`finish` writes nothing. :meth:`done` is the handler's last call:
for a response left incomplete (cut, or the client gone) the connection is closed, so the
server never ends the body as if it were whole; it also disarms the sink's timer. :meth:`finish`
is bounded by the deadline of the last write (it ends that write's response). A write to a
closed connection raises ``ConnectionResetError``, which is ``ClientGone``. While the core
serves, :class:`CancelledOnDisconnect` watches the connection's end (a future the edge resolves):
when the client leaves first it marks the sink gone and cancels the core's lifecycle, which
releases what it holds in ``finally``. A disconnect after the response was complete, or caused
by the sink's own cut, is not the client leaving and is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable
from types import TracebackType
from typing import Any

from narwhal.core.ports import ClientGone, Clock, TimedOut, WriteResult
from narwhal.core.stalls import StallLedger
from narwhal.live.clock import AnyioClock
from narwhal.live.h1request import EdgeRequest
from narwhal.live.waits import Deadline

_TIMED_OUT = TimedOut()


class WriteDeadline(Deadline["ResponseSink"]):
    """Ends a write to the client still blocked at its deadline: the sink cuts its connection."""

    __slots__ = ()

    def expire(self, waiter: ResponseSink) -> None:
        waiter.cut_off()


class ResponseSink:
    """Writes one HTTP response to an edge request, each write within its deadline."""

    def __init__(
        self,
        request: EdgeRequest,
        extra_headers: dict[str, str] | None = None,
        *,
        clock: Clock | None = None,
        stalls: StallLedger | None = None,
    ) -> None:
        self._request = request
        self._extra = dict(extra_headers or {})
        self._timer = WriteDeadline(clock or AnyioClock(), stalls)
        self.gone = False
        self.cut = False  # a write timed out: nothing more is written
        self.started = False  # the status and head are fixed (a committed head may be held)
        self.finished = False  # the body's end was written
        self.status: int | None = None

    async def _drained(self, deadline: float) -> WriteResult:
        """Wait, until ``deadline``, while the client is not reading what was written;
        ``TimedOut`` when it was still waiting then. A loss during the wait marks the sink
        gone (the loss cancels the request: :class:`CancelledOnDisconnect`)."""
        request = self._request
        if not request.conn.writing_paused:
            return None
        timer = self._timer
        timer.wait_begins(deadline, self)
        try:
            await request.drain()
        except OSError:
            if not self.cut:  # lost, not cut by the deadline
                self.gone = True
        finally:
            timer.waiter = None
        return _TIMED_OUT if self.cut else None

    def _write(self, write: Callable[[bytes], None], data: bytes) -> bool:
        """One write to the transport; False (and the sink gone) when the connection is."""
        try:
            write(data)
        except OSError:
            self.gone = True
            return False
        return True

    async def respond(
        self,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float = math.inf,
    ) -> WriteResult:
        if self.started:
            raise RuntimeError("respond() after the response started")
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        self.started, self.status = True, status
        try:
            self._request.respond(
                status,
                {**self._extra, **headers, "content-type": "application/json"},
                json.dumps(body).encode(),
            )
        except OSError as error:
            self.gone = True
            raise ClientGone() from error
        self.finished = True
        result = await self._drained(deadline)
        if self.gone:
            raise ClientGone()
        return result

    async def commit(self, headers: dict[str, str], deadline: float = math.inf) -> WriteResult:
        if self.started:
            raise RuntimeError("commit() after the response started")
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        # the head is held, not written: nothing here waits on the client, and the first
        # send's deadline bounds the head with the bytes it goes out with
        self._request.hold_head(200, {**self._extra, **headers})
        self.started, self.status = True, 200
        return None

    async def send(self, data: bytes, deadline: float = math.inf) -> WriteResult:
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        assert self.started, "send() before commit()"
        if not self._write(self._request.write, data):
            return None  # the loss cancels the request; a later write raises ClientGone
        if not self._request.conn.writing_paused:
            return None  # the usual case, once per read of a stream: nothing to wait for
        return await self._drained(deadline)

    def send_now(self, data: bytes) -> bool:
        if self.gone or self.cut or not self.started or self._request.conn.writing_paused:
            return False
        self._write(self._request.write, data)  # a loss cancels the request: taken all the same
        return True

    async def end(self, data: bytes, deadline: float = math.inf) -> WriteResult:
        """A committed stream's last bytes and its body's end, in one write (the last chunk,
        the chunked terminator and a head still held go out together)."""
        if self.gone:
            raise ClientGone()
        if self.cut:
            return _TIMED_OUT
        assert self.started, "end() before commit()"
        if not self._write(self._request.write_eof, data):
            return None
        result = await self._drained(deadline)
        self.finished = not self.gone and not self.cut
        return result

    async def finish(self, last: bytes = b"") -> None:
        """End a committed body, after ``last`` (no-op when the response is complete, never
        began, or was cut), within the deadline of the last write."""
        if self.started and not self.finished and not self.gone and not self.cut:
            self.finished = True
            if self._write(self._request.write_eof, last):
                await self._drained(self._timer.deadline)

    def cut_off(self) -> None:
        """The write in progress outlasted its deadline: cut the client off. Aborting the
        connection ends the write's wait (it fails with ``ConnectionResetError``), and the
        write then reports ``TimedOut``; the connection's end is not a disconnect."""
        self.cut = True
        self._request.abort()

    def done(self) -> None:
        """The handler's last call. A response not complete (cut, the client gone, or never
        begun) closes the connection, after a committed head still held: the client sees the
        200, and nothing more is written."""
        self._timer.disarm()
        request = self._request
        if not self.finished or self.gone or self.cut:
            if self.started and not self.gone and not self.cut:
                with contextlib.suppress(ConnectionError):
                    request.send_held_head()
            request.close()


class CancelledOnDisconnect:
    """``async with CancelledOnDisconnect(closed, sink):`` cancels the block when the client's
    connection closes first; that cancellation ends at the block (``left`` is then True), and
    any other cancellation or error propagates.

    No task of its own: the connection's end is a future, and a callback on it expires the
    ``asyncio.timeout`` scope the block runs in (a scope with no deadline of its own), so
    asyncio itself tells that cancellation apart from any other (a shutdown's, which
    propagates). A context manager rather than a function that awaits the work: the block runs
    in its caller's frame, and every streamed read resumes the chain of frames it waits in."""

    __slots__ = ("_closed", "_scope", "_sink", "left")

    def __init__(self, closed: asyncio.Future[None], sink: ResponseSink) -> None:
        self._closed = closed
        self._sink = sink
        self._scope = asyncio.timeout(None)
        self.left = False

    def _on_close(self, _: asyncio.Future[None]) -> None:
        sink = self._sink
        if not sink.finished and not sink.cut:  # a cut is the sink's own doing
            sink.gone = True
            self._scope.reschedule(asyncio.get_running_loop().time())  # expire now

    async def __aenter__(self) -> CancelledOnDisconnect:
        await self._scope.__aenter__()
        self._closed.add_done_callback(self._on_close)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._closed.remove_done_callback(self._on_close)
        try:
            await self._scope.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            if not self._scope.expired():
                raise  # not the scope's own
            self.left = True
            return True
        return False
