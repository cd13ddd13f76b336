"""HTTP/1.1 to the engines: kept-alive connections on asyncio protocols, parsed by llhttp.

Rule kept here: one request at a time per connection, and a connection goes back to the pool
only when its response came to its end and both sides allow keep-alive; any doubt (a parse error,
an unread or unfinished body, a cancelled wait, a lost connection) closes it. Every buffer has a
bound: the response head (``MAX_HEAD_BYTES``), and a body's unread bytes (reading pauses at
``HIGH_WATER`` until the reader catches up).

Why not ``aiohttp.ClientSession``: a request through it builds a request object, a response
object, a pool key and (on Python 3.11) a task that writes the body; for the engine legs, which
are a small JSON POST and a read, that is about two thirds of the CPU of a call (measured
once, when this client was written; docs/live.md, "The engine client"). Here a call is one
``transport.write`` of head and body on a pooled connection and the reply is parsed in
``data_received`` by llhttp (``httptools``, the parser uvicorn uses), which also undoes the
chunked encoding.

Theory of operation: an :class:`H1Connection` is the protocol of one socket. ``send`` writes a
request and resets the response state; the parser's callbacks fill the status, the headers and
a list of body pieces; one waiter future (only one reader at a time) is woken when the head is
complete, when body bytes arrive, at the message's end, and at any failure. :meth:`readany`
returns every piece held (several engine writes that arrived together are one read), ``b""`` at
the end of the body. A failure is kept and raised by every later read after the bytes already
held; :meth:`set_exception` is how a read's deadline ends it. The connection's loss ends a body
that runs to the end of the connection (neither a length nor chunked) and fails any other.

An :class:`H1Pool` keeps each origin's idle connections as a stack (the most recently used is
reused first, so a quiet origin's extra connections age out) and counts every open connection
against one ``limit``: at the limit a new connection first closes an idle one of another origin,
else waits for any connection to be released or closed. A connection idle longer than
``keepalive_s`` is never reused (it is closed when found, and a sweep timer closes the rest), so
it cannot race the engine's own keep-alive close.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from narwhal.live.h1errors import ConnectionLost, EngineProtocolError
from narwhal.live.h1request import check_headers

MAX_HEAD_BYTES = 64 * 1024  # a response head (status line and headers) longer than this is a fault
HIGH_WATER = 256 * 1024  # unread body bytes at which the socket stops being read
_FRAMING = (b"content-length", b"transfer-encoding")  # a body with either ends on its own


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a connection goes: the scheme, host and port of an engine URL, its Host header,
    and the URL's path (the prefix of every request path)."""

    host: str
    port: int
    tls: bool
    host_header: str
    prefix: str

    @staticmethod
    def of(url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return Origin(parts.hostname, port, tls, parts.netloc, parts.path.rstrip("/"))


def request_bytes(
    method: str, origin: Origin, path: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    """One request's head and body, ready for one write. ``headers`` must not repeat the ones
    set here (Host, Content-Length)."""
    check_headers(headers)  # a request id or key with a line break cannot smuggle a header
    lines = [f"{method} {origin.prefix}{path} HTTP/1.1", f"Host: {origin.host_header}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    if body is not None or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body) if body is not None else 0}")
    lines.append("\r\n")  # the blank line that ends the head
    head = "\r\n".join(lines).encode("latin-1")
    return b"".join((head, body)) if body else head


class H1Connection(asyncio.Protocol):
    """One socket to an engine: writes a request, parses its response."""

    def __init__(self, pool: H1Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.counted = False  # in the pool's count of open connections (once it was handed out)
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._paused = False
        self.on_end: Callable[[], None] | None = None  # called once the response ends or fails
        self.relay: Callable[[bytes], bool] | None = None  # offered the body's reads first
        self._begin()

    def _begin(self) -> None:
        self.relay = None
        self.status = 0
        self.head_done = False
        self.complete = False  # the response's body came to its end
        self.keep_alive = False
        self._until_eof = True  # no length, not chunked: the body ends with the connection
        self._head_bytes = 0
        self._pieces: list[bytes] = []
        self._held = 0
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ the request

    def send(self, data: bytes) -> None:
        """Write one request (head and body); the response state starts afresh."""
        assert self.transport is not None
        self._begin()
        self.transport.write(data)

    async def head(self) -> None:
        """Wait until the response's head is parsed (raises the connection's failure)."""
        while not self.head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def readany(self) -> bytes:
        """Every body byte held (waiting for some if none is); ``b""`` at the body's end."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        pieces = self._pieces
        data = b"".join(pieces)  # (one piece: that piece itself, not a copy)
        self._pieces = []
        self._held = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def has_unread(self) -> bool:
        return bool(self._pieces)

    def at_eof(self) -> bool:
        return self.complete and not self._pieces

    def failed(self) -> bool:
        return self._error is not None

    def set_exception(self, error: BaseException) -> None:
        """End the read in progress (and every later one) with ``error``."""
        if self._error is None:
            self._error = error
        self._wake()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self._error is None

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _wait(self) -> asyncio.Future[None]:
        """The future the one reader awaits until the next wake (a future, not a coroutine:
        a read adds no frame to the chain a wake resumes). A waiter whose reader was cancelled
        is done, so a wake skips it."""
        waiter = self._waiter = self._loop.create_future()
        return waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if not self.complete:
            self.set_exception(error)
        self.keep_alive = False
        self.close()

    # ------------------------------------------------------------------ the protocol's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def eof_received(self) -> None:
        """The engine closed its side: the transport closes (``connection_lost`` follows)."""

    def pause_writing(self) -> None:
        """A request is one write, bounded by the client's body limit: nothing to pause."""

    def resume_writing(self) -> None:
        """See :meth:`pause_writing`."""

    def data_received(self, data: bytes) -> None:
        if self.complete:  # bytes nobody asked for: this connection cannot be trusted again
            self.keep_alive = False
            self.close()
            return
        if not self.head_done and self._head_bytes + len(data) > MAX_HEAD_BYTES:
            # Feed what the bound allows; the head must end within it.
            allowed = MAX_HEAD_BYTES - self._head_bytes
            if not self._feed(data[:allowed]):
                return
            if not self.head_done:
                self._fail(EngineProtocolError("response head too long"))
                return
            data = data[allowed:]
        elif not self.head_done:
            self._head_bytes += len(data)
        if not self._feed(data):
            return
        if self.relay is not None and self._pieces:
            self._offer()
        if self._held > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; False (and the connection failed) if it is not HTTP."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(EngineProtocolError(str(error)))
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self._error is None:
            if self.head_done and self._until_eof:
                self.complete = True  # the body ran to the end of the connection, as it said
            else:
                self._error = ConnectionLost("connection lost before the response ended")
        self.keep_alive = False
        self._wake()
        self.pool.forget(self)
        self._ended()

    # ------------------------------------------------------------------ llhttp callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # a second response in the same read: nobody asked for it
            raise EngineProtocolError("bytes after the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        # only the framing is read: no decision looks at an engine's response headers
        if self._until_eof and name.lower() in _FRAMING:
            self._until_eof = False

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # 1xx: not a final response (the router never asks for one)
            raise EngineProtocolError(f"an informational response ({status})")
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        if self.status in (204, 304):
            self._until_eof = False
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)
        self._held += len(body)
        if self.relay is None:
            self._wake()

    def _offer(self) -> None:
        """A read's body bytes, with a relay set: offered to it whole when the reader is
        waiting for them and the body goes on; the reader is woken when the relay declines
        them (they stay held for it) or cannot be asked."""
        waiter = self._waiter
        if waiter is not None and not waiter.done() and not self.complete and self._error is None:
            assert self.relay is not None
            pieces = self._pieces
            data = b"".join(pieces)
            if self.relay(data):
                self._pieces = []
                self._held = 0
                return
            self._pieces = [data]
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()
        self._ended()

    def _ended(self) -> None:
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            on_end()


class H1Pool:
    """Kept-alive connections to every origin, at most ``limit`` open at once."""

    def __init__(self, limit: int, keepalive_s: float) -> None:
        self.limit = limit
        self.keepalive_s = keepalive_s
        self.open = 0  # connections open or being opened, idle or busy
        self._idle: dict[Origin, list[H1Connection]] = {}
        self._room: deque[asyncio.Future[None]] = deque()  # waiting for a connection to end
        self._sweep: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    def idle(self) -> list[H1Connection]:
        return [conn for stack in self._idle.values() for conn in stack]

    def take_idle(self, origin: Origin) -> H1Connection | None:
        """An idle connection to ``origin`` within its keep-alive, if there is one (no wait)."""
        stack = self._idle.get(origin)
        if stack:
            now = asyncio.get_running_loop().time()
            while stack:
                conn = stack.pop()
                if not conn.closed and now - conn.idle_since <= self.keepalive_s:
                    return conn
                conn.close()
        return None

    async def acquire(self, origin: Origin) -> H1Connection:
        """A connection to ``origin``: an idle one within its keep-alive, else a new one (once
        there is room for it)."""
        loop = asyncio.get_running_loop()
        while True:
            idle = self.take_idle(origin)
            if idle is not None:
                return idle
            if self._closed:
                raise ConnectionLost("the engine connection pool is closed")
            if self.open < self.limit:
                break
            self._close_idle_elsewhere(origin)  # its loss, or any release, makes room
            waiter = loop.create_future()
            self._room.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._room:
                    self._room.remove(waiter)
        self.open += 1
        try:
            _, conn = await loop.create_connection(
                lambda: H1Connection(self, origin),
                origin.host,
                origin.port,
                ssl=self._tls_context() if origin.tls else None,
            )
        except BaseException:
            # (cancelled after the socket was made: the connection's own loss is not counted)
            self.open -= 1
            self._make_room()
            raise
        conn.counted = True
        return conn

    def release(self, conn: H1Connection) -> None:
        """Take back a connection whose response was read to its end (else close it)."""
        if not conn.reusable() or self._closed:
            conn.close()
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        self._idle.setdefault(conn.origin, []).append(conn)
        if self._sweep is None:
            self._sweep = loop.call_later(self.keepalive_s, self._expire)
        self._make_room()

    def forget(self, conn: H1Connection) -> None:
        """A connection ended (called by the connection itself)."""
        if not conn.counted:
            return
        conn.counted = False
        self.open -= 1
        stack = self._idle.get(conn.origin)
        if stack is not None and conn in stack:
            stack.remove(conn)
        self._make_room()

    def close(self) -> None:
        """Close every idle connection; busy ones are closed by whoever holds them."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in self.idle():
            conn.close()
        while self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _make_room(self) -> None:
        while self._room:
            waiter = self._room.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_idle_elsewhere(self, origin: Origin) -> None:
        for other, stack in self._idle.items():
            if other != origin and stack:
                stack.pop(0).close()  # the oldest
                return

    def _expire(self) -> None:
        self._sweep = None
        loop = asyncio.get_running_loop()
        oldest_kept = loop.time() - self.keepalive_s
        left = False
        for stack in self._idle.values():
            while stack and stack[0].idle_since < oldest_kept:
                stack.pop(0).close()
            left = left or bool(stack)
        if left:
            self._sweep = loop.call_later(self.keepalive_s, self._expire)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
