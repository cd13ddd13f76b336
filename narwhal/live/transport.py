"""The live transport: the core's :class:`~narwhal.core.ports.Transport` port over HTTP/1.1.

Rule kept here: every method returns a result value (``Reply``, ``StreamOpened``, ``Chunk``,
``StreamEnd``, ``ConnectFailed``, ``TimedOut``) and never raises for an engine fault; it makes no
decision about what a result means (that is the core's job).

Theory of operation: one :class:`~narwhal.live.h1client.H1Pool` (kept-alive connections bounded
by ``max_connections``, llhttp's parser) serves every engine; a call is one write of the request
on a pooled connection. Nothing is sent that asks for an encoded response (no
``Accept-Encoding``: engines answer in identity, and SSE is never encoded), no proxy is used, no
cookie kept. A deadline is an absolute time on the clock, kept on the time the router's event
loop was running (:mod:`narwhal.live.waits`: the router's own stalls, measured by its lag
monitor, push a pending deadline back, so a reply that arrived during a stall is read before the
deadline is judged). Every wait on a connection is
bounded by a :class:`~narwhal.live.waits.ReadDeadline`: one loop timer, re-armed only when the
deadline moves earlier, that ends a wait outlasting its deadline by setting an exception on the
connection (no task is cancelled; another cancellation simply propagates; expiry becomes
``TimedOut()``). A call has one for its response; a stream has one from its open through every
read (:meth:`next_chunk` runs once per streamed chunk, and its deadline costs a comparison and a
few assignments). Only waiting for a connection (one to open, or room in the pool) runs under
:func:`~narwhal.live.waits.deadline_at`, a scope of its own; a kept-alive idle connection is
taken without a wait. A chunk is whatever the connection holds when the read returns:
several engine writes that arrived together are one chunk. A failure to connect maps to
``ConnectFailed("refused")``; any later socket error, a lost connection or a response llhttp
cannot parse to ``ConnectFailed("reset")``. A stream whose status is not 200 is read whole (up
to ``MAX_REPLY_BYTES + 1`` bytes) into ``StreamOpened.body`` and closed at once.

Closing must be synchronous (the core calls :meth:`close_stream` and :meth:`release_handoff`
from ``finally`` blocks, possibly in a cancelled task), so neither awaits anything. A stream read
to its end gives its connection back to the pool at once; one with unread bytes waiting (the
engine is still streaming) is closed at once, which is how the engine learns that the request
was abandoned (vLLM aborts it). Any other (just after ``[DONE]`` only the end of the chunked
body is left) is drained: it stays open for up to ``DRAIN_S`` (reading pauses past the
connection's buffer bound meanwhile); if the body ends in time the connection goes back to the
pool, else it is closed. A drain is a loop timer, not a task. A wait that does not finish (a
deadline, a cancellation) closes its connection: its response may still come.
``release_handoff`` POSTs the descriptor to ``<producer>/kv/release`` in a task the transport
owns, bounded by ``BACKGROUND_TIMEOUT_S``; whom to ask and what an answer teaches (a 404/405:
never asked again) is the core's :class:`~narwhal.core.handoff_release.HandoffReleases`.
The transport is an async context manager: leaving it closes the open
streams and pending drains, waits for the release tasks (each bounded) and closes the pool's
idle connections. Used without ``async with`` (e.g. by ``EngineClient.http``), call
:meth:`aclose` when done.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from narwhal.core.handoff_release import RELEASE_PATH, HandoffReleases
from narwhal.core.legs import MAX_REPLY_BYTES
from narwhal.core.ports import (
    CallResult,
    Chunk,
    ChunkResult,
    Clock,
    ConnectFailed,
    OpenResult,
    Relay,
    Reply,
    StreamEnd,
    StreamOpened,
    TimedOut,
)
from narwhal.core.stalls import StallLedger
from narwhal.live.h1client import H1Connection, H1Pool, Origin, request_bytes
from narwhal.live.h1errors import EngineProtocolError
from narwhal.live.jsonwrite import encode_json
from narwhal.live.waits import DeadlinePassed, ReadDeadline, deadline_at

BACKGROUND_TIMEOUT_S = 2.0
DRAIN_S = 0.1
MAX_CACHED_ORIGINS = 1024

# An idle pooled connection is dropped after this long, well before the engines' servers close
# it (uvicorn's and vLLM's keep-alive timeout is 5 s): with equal timeouts a health check every
# 5 s raced the server's close, read a reset and ejected a healthy engine (seen on the real vLLM
# pair: 9 of 40 requests answered 503 "no engine").
KEEPALIVE_EXPIRY_S = 2.0

ENGINE_ERRORS = (OSError, EngineProtocolError)
"""What a call to an engine can raise for the engine's (or the network's) fault: a socket error
(a lost connection included), a response llhttp cannot parse."""

JSON_HEADERS = {"Content-Type": "application/json"}


async def _read_bounded(conn: H1Connection) -> bytes:
    """The whole body, or its first ``MAX_REPLY_BYTES + 1`` bytes: the core refuses a longer
    reply, and holding the rest of a runaway one would only exhaust memory (the connection of a
    response left unread is closed)."""
    parts: list[bytes] = []
    held = 0
    while held <= MAX_REPLY_BYTES:
        data = await conn.readany()
        if not data:
            break
        parts.append(data)
        held += len(data)
    return b"".join(parts)[: MAX_REPLY_BYTES + 1]


class H1Stream:
    """An open upstream stream (the core's opaque stream handle)."""

    __slots__ = ("closed", "conn", "deadline", "status")

    def __init__(self, conn: H1Connection, deadline: ReadDeadline) -> None:
        self.conn = conn
        self.status = conn.status
        self.deadline = deadline  # ends a read that outlasts its deadline
        self.closed = False


class EngineTransport:
    """Engine calls over one pool of kept-alive HTTP/1.1 connections; use as ``async with``."""

    def __init__(
        self,
        clock: Clock,
        *,
        max_connections: int = 1000,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
        stalls: StallLedger | None = None,
    ) -> None:
        self._clock = clock
        self._stalls = stalls  # the router's stalls, which extend every deadline (None: exact)
        self.pool = H1Pool(max_connections, keepalive_expiry_s)
        self._origins: dict[str, Origin] = {}
        self.releases = HandoffReleases()  # the producers not asked again
        self._open: set[H1Stream] = set()  # handed to the core, not closed yet
        self._draining: dict[H1Stream, asyncio.TimerHandle] = {}  # closed, body not at its end
        self._releases: set[asyncio.Task[None]] = set()  # owned: awaited by aclose()
        self._closing = False  # aclose() began: no new release is started

    async def __aenter__(self) -> EngineTransport:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the open streams and pending drains (dropping their connections), wait for the
        release tasks (each bounded), then close the pool's idle connections."""
        self._closing = True
        for stream in list(self._open):
            self.close_stream(stream)
        for stream, cut in list(self._draining.items()):
            cut.cancel()
            self._cut(stream)
        try:
            if self._releases:
                await asyncio.gather(*self._releases, return_exceptions=True)
        finally:
            self.pool.close()

    @property
    def draining(self) -> int:
        """Closed streams still waiting (bounded) for their body's end."""
        return len(self._draining)

    def _origin(self, url: str) -> Origin:
        origin = self._origins.get(url)
        if origin is None:
            if len(self._origins) >= MAX_CACHED_ORIGINS:
                self._origins.clear()
            origin = self._origins[url] = Origin.of(url)
        return origin

    async def _exchange(
        self,
        method: str,
        url: str,
        path: str,
        body: Any,
        headers: dict[str, str],
        deadline: float,
        timer: ReadDeadline,
    ) -> H1Connection:
        """Send one request and wait for its response's head, both by ``deadline``; the
        connection is the caller's, with ``timer`` watching it (the caller ends the wait).
        Raises ``_Refused`` for a connection that could not be opened, ``TimeoutError`` for a
        deadline passed while waiting for a connection, ``DeadlinePassed`` for one passed
        once the request was sent."""
        origin = self._origin(url)
        payload = None
        if body is not None:
            headers = {**headers, **JSON_HEADERS}
            payload = encode_json(body)
        data = request_bytes(method, origin, path, headers, payload)
        conn = self.pool.take_idle(origin)
        if conn is None:  # a connection to open, or room to wait for: an await of its own
            async with deadline_at(self._clock, self._stalls, deadline):
                try:
                    conn = await self.pool.acquire(origin)
                except OSError as error:  # (the scope's own TimeoutError is raised past this)
                    raise _Refused from error
        timer.wait_begins(deadline, conn)
        try:
            conn.send(data)
            await conn.head()
        except BaseException:
            conn.close()
            raise
        return conn

    def _finish(self, conn: H1Connection) -> None:
        """Give a connection back to the pool if its response came to its end, else close it."""
        if conn.at_eof():
            self.pool.release(conn)
        else:
            conn.close()

    # ------------------------------------------------------------------ the port

    async def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> CallResult:
        timer = ReadDeadline(self._clock, self._stalls)
        try:
            conn = await self._exchange(method, url, path, body, headers, deadline, timer)
            try:
                content = await _read_bounded(conn)
            finally:
                self._finish(conn)
        except (TimeoutError, DeadlinePassed):
            return TimedOut()
        except _Refused:
            return ConnectFailed("refused")
        except ENGINE_ERRORS:
            return ConnectFailed("reset")
        finally:
            timer.disarm()
        return Reply(conn.status, content)

    async def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> OpenResult:
        stream: H1Stream | None = None
        result: OpenResult = TimedOut()
        timer = ReadDeadline(self._clock, self._stalls)  # the open's, then the stream's reads'
        try:
            conn = await self._exchange("POST", url, path, body, headers, deadline, timer)
            stream = H1Stream(conn, timer)
            self._open.add(stream)
            if stream.status == 200:
                result = StreamOpened(stream, 200)
            else:
                result = StreamOpened(stream, stream.status, await _read_bounded(conn))
        except (TimeoutError, DeadlinePassed):
            result = TimedOut()
        except _Refused:
            result = ConnectFailed("refused")
        except ENGINE_ERRORS:
            result = ConnectFailed("reset")
        finally:
            # Only a 200 stream is the caller's to close. Anything else is closed here, even
            # when the request is cancelled mid-way (the client left while an error body was
            # being read): its connection would otherwise stay open until shutdown.
            if isinstance(result, StreamOpened) and result.status == 200:
                timer.waiter = None  # the open's wait ended; the stream's reads begin their own
            elif stream is not None:
                self.close_stream(stream)  # (which disarms the timer)
            else:
                timer.disarm()
        return result

    async def next_chunk(self, handle: Any, deadline: float) -> ChunkResult:
        stream: H1Stream = handle
        if stream.closed:
            return StreamEnd()
        conn = stream.conn
        timer = stream.deadline
        timer.wait_begins(deadline, conn)
        try:
            data = await conn.readany()
        except DeadlinePassed:
            return TimedOut()
        except ENGINE_ERRORS:
            return ConnectFailed("reset")
        finally:
            timer.waiter = None  # the wait ended
        if not data:
            return StreamEnd()
        return Chunk(data)

    def relay_reads(self, handle: Any, relay: Relay) -> bool:
        stream: H1Stream = handle
        if stream.closed:
            return False
        conn, timer, now = stream.conn, stream.deadline, self._clock.now

        def offered(data: bytes) -> bool:
            deadline = relay(data, now())
            if deadline is None:
                return False
            timer.wait_begins(deadline, conn)  # the read still awaited now waits for the next
            return True

        conn.relay = offered
        return True

    def close_stream(self, handle: Any) -> None:
        stream: H1Stream = handle
        if stream.closed:
            return
        stream.closed = True
        stream.conn.relay = None
        stream.deadline.disarm()
        self._open.discard(stream)
        conn = stream.conn
        if conn.at_eof() or conn.failed() or conn.closed:
            self._finish(conn)
            return
        if conn.has_unread():  # the engine is still streaming: abandon it now
            conn.close()
            return
        # Wait (bounded) for the end of the body: at its end the connection goes back to the
        # pool; if it has not ended by then, the connection is closed.
        self._draining[stream] = asyncio.get_running_loop().call_later(DRAIN_S, self._cut, stream)
        conn.on_end = lambda: self._drained(stream)

    def _drained(self, stream: H1Stream) -> None:
        cut = self._draining.pop(stream, None)
        if cut is not None:
            cut.cancel()
        self._finish(stream.conn)

    def _cut(self, stream: H1Stream) -> None:
        self._draining.pop(stream, None)
        stream.conn.on_end = None
        stream.conn.close()

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        if self._closing or not self.releases.asks(producer_url):
            return
        task = asyncio.get_running_loop().create_task(self._release(producer_url, descriptor))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        body = self.releases.body(descriptor)
        deadline = self._clock.now() + BACKGROUND_TIMEOUT_S
        reply = await self.call(producer_url, "POST", RELEASE_PATH, body, {}, deadline)
        self.releases.answered(producer_url, reply)


class _Refused(Exception):
    """The connection to the engine could not be opened."""
