"""The router's HTTP/1.1 server: client connections on asyncio protocols, parsed by llhttp,
with the time, size and count bounds an edge needs.

Rule kept here (``[client]`` settings, docs/live.md "Limits at the edge"):

- a connection with no request in progress is closed after ``idle_timeout_s``, from its accept
  as well as after each response;
- a request head not complete ``head_timeout_s`` after its first byte is answered 408 (an OpenAI
  error object) and closed; one still incomplete once more than :data:`MAX_HEAD_BYTES` of it
  have arrived is answered 431 and closed; bytes llhttp cannot parse are answered 400 and closed,
  at once even inside a body whose handler runs (its body read fails; nothing waits for
  ``body_timeout_s``), and a complete head :mod:`narwhal.live.h1strict` refuses (Host,
  transfer codings, version) gets its 400, 501 or 505 and a close; a chunked body's trailer
  fields are dropped, never merged into the request's headers;
- a request body not complete ``body_timeout_s`` after its handler started is answered 408 and
  closed, and the handler's body read fails; when the answer has already begun (a 401 needs no
  body), the connection is just closed then;
- with ``max_connections`` open, one more is closed as soon as it is accepted (the counts of
  connections open, refused and reading a body are :mod:`narwhal.live.edge_counts`);
- one request at a time per connection: a request parsed while another is handled waits (the
  socket stops being read), and the answers go out in the requests' order;
- a client that half-closes (EOF) after a complete request still gets its answer, then the
  connection closes, and one that closed its socket entirely is still noticed and its request
  cancelled (within about :data:`GONE_PROBE_MAX_S` while its answer has not begun, at the next
  write after); an EOF anywhere else (mid-head, mid-body, between requests) is a disconnect;
- the connection's end is a future, :attr:`EdgeConnection.closed`, that the app watches
  (:class:`narwhal.live.sink.CancelledOnDisconnect`); nothing else tells a handler its client left;
- on shutdown idle connections close at once and a request in progress has one grace period,
  then its handler is cancelled (and may still answer, briefly).

Why: without these a slowloris head or a 1-byte/s body holds a connection forever, and enough
such sockets exhaust the router's descriptors, which its own connections to the engines need (an
engine it cannot dial would be charged for it); an unbounded head keeps the event loop busy
parsing until health checks time out. None of this reaches the core: a request cut here never
started, so no engine is charged and no reservation was taken. Why not aiohttp's server: a
request through it builds a message, a request object, a payload stream and a response object,
about twice the CPU of this protocol for a one-token stream (measured once, when this server
was written; docs/live.md, "The engine client").

Theory of operation: llhttp (``httptools``) calls back with the head's pieces, then the body's;
a complete head becomes an :class:`~narwhal.live.h1request.EdgeRequest`, whose handler runs as
one task the :class:`EdgeServer` holds (or, while another is handled, waits in order, with the
socket paused). The head timer is armed when a head begins while no request is being handled
and cancelled when it completes; the idle timer is armed at the accept and after each answer
and cancelled when a head begins; the body timer is armed when a handler starts with its body
still arriving and cancelled at the body's end. A head is bounded by counting the bytes received
while no body is open: a read in which a head completed starts the count again, so llhttp never
works on more than the bound plus one read of one head. A timer that fires writes its 408 unless
the answer began, and closes. After an answer the connection reads on (the next request), or
closes: when the answer is not whole, the request or HTTP/1.0 forbids keep-alive, the client
sent EOF, or the server shuts down. A body left unread by an answer is read and dropped up to
its end, within the body timer. ``eof_received`` keeps the transport open (returns True) only
while a complete request awaits its answer; TCP cannot tell that half-close from a close, only a
write can, so until the answer begins an HTTP/1.1 client is sent interim ``100 Continue``
responses at the EOF and then at doubling intervals: a closed socket answers with a reset, a
write after it fails, and the connection is lost. Write flow control is asyncio's:
``pause_writing`` makes :meth:`EdgeConnection.drain` wait, ``resume_writing`` wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import httptools

from narwhal.core import wire
from narwhal.core.config import ClientSettings
from narwhal.live.edge_counts import ClientConnections
from narwhal.live.h1request import (
    BODY_HIGH_WATER,
    CONTINUE,
    EdgeRequest,
    Headers,
    Response,
    refusal,
    target_path,
)
from narwhal.live.h1strict import HeadRefused, head_refusal

MAX_HEAD_BYTES = 64 * 1024
GONE_PROBE_FIRST_S = 0.05  # after the probe written at the EOF itself
GONE_PROBE_MAX_S = 1.0  # a client gone is noticed within about this

log = logging.getLogger("narwhal.live")

Handler = Callable[[EdgeRequest], Awaitable[Response | None]]


class EdgeConnection(asyncio.Protocol):
    """One client connection; :class:`EdgeServer` makes it with the ``[client]`` settings."""

    def __init__(self, server: EdgeServer) -> None:
        self.server = server
        self.settings = server.settings
        self._loop = server.loop
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url: list[bytes] = []
        self._fields: dict[str, str] = {}
        self._hosts: list[str] = []  # the head's Host values (h1strict.py checks them)
        self._codings: list[str] = []  # the head's Transfer-Encoding values
        self._refused: HeadRefused | None = None  # the head just refused, raised out of llhttp
        self._in_message = False  # llhttp is inside a request (its head or its body)
        self._open_body: EdgeRequest | None = None  # the request whose body is arriving
        self._heads = 0  # heads completed (a read that completes one restarts the count)
        self._head_bytes = 0
        self._current: EdgeRequest | None = None  # the request being handled
        self._queue: deque[EdgeRequest] = deque()  # parsed while another was handled
        self._refusal: bytes | None = None  # to answer once the requests before it are
        self._no_more = False  # nothing more is parsed (a refusal, an upgrade, the EOF)
        self._eof = False
        self._lost = False
        self._reading_paused = False
        self.writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # None: a request is in progress
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._probe_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self.server
        if not server.counts.accept(self) or server.shutting_down:
            self.transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._arm_idle()

    @property
    def reading_body(self) -> bool:
        """Whether a request's head has arrived and its body is still arriving (counted)."""
        return self._open_body is not None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.server.counts.lose(self)
        for timer in (self._idle_timer, self._head_timer, self._body_timer, self._probe_timer):
            if timer is not None:
                timer.cancel()
        self._fail_bodies()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(ConnectionResetError("the client connection was lost"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail_bodies(self) -> None:
        error = ConnectionResetError("the client connection closed before the body's end")
        for request in (self._current, self._open_body, *self._queue):
            if request is not None:
                request.fail_body(error)

    def close(self) -> None:
        """Close once what the transport holds is written; body reads fail now."""
        self._no_more = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        self._fail_bodies()

    def abort(self) -> None:
        self._no_more = True
        if self.transport is not None:
            self.transport.abort()

    def closing_after_answer(self) -> bool:
        """No request follows the one being answered (its answer says so, in HTTP/1.1)."""
        return self._eof or self.server.shutting_down or (self._no_more and not self._queue)

    def busy(self) -> bool:
        """A request is being handled."""
        return self._current is not None

    def eof_received(self) -> bool:
        """Keep the transport open for writing only while a complete request awaits its
        answer (a half-close); anything else is a disconnect: the transport closes."""
        self._eof = True
        request = self._current
        if request is None or self._queue or self._in_message or not request.complete:
            return False
        if request.version >= (1, 1):  # HTTP/1.0 takes no interim responses
            self._probe(request, GONE_PROBE_FIRST_S)
        return True

    def _probe(self, request: EdgeRequest, next_s: float) -> None:
        """Write one interim ``100 Continue`` while the answer has not begun, then again after
        ``next_s`` (doubling up to :data:`GONE_PROBE_MAX_S`). A client that half-closed reads
        past it (every HTTP/1.1 client must); one that closed its socket entirely answers the
        write with a reset, which loses the connection and disconnects the request."""
        self._probe_timer = None
        if self._current is not request or request.written or self._lost:
            return
        self.write_raw(CONTINUE)
        self._probe_timer = self._loop.call_later(
            next_s, self._probe, request, min(2 * next_s, GONE_PROBE_MAX_S)
        )

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Part of an answer; ``ConnectionResetError`` once the connection is closing."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("cannot write to a closing client connection")
        transport.write(data)

    def write_raw(self, data: bytes) -> None:
        """Bytes outside any answer (interim responses, refusals), never raising."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def drain(self) -> None:
        if not self.writing_paused:
            return
        if self._lost:
            raise ConnectionResetError("the client connection was lost")
        drain = self._drain = self._loop.create_future()
        try:
            await drain
        finally:
            self._drain = None

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # ------------------------------------------------------------------ reading

    def data_received(self, data: bytes) -> None:
        if self._no_more:
            return
        if self._open_body is None:
            self._head_bytes += len(data)
            if not self._in_message and data[:1] in (b"\r", b"\n"):
                # llhttp skips line breaks before a request line; h11, stricter, refuses them
                self._refuse(400, "malformed HTTP request: a line break before the request line")
                return
        heads = self._heads
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._no_more = True  # no protocol switch here: answer what was parsed, then close
        except httptools.HttpParserError as error:
            refused, self._refused = self._refused, None
            if refused is not None:
                log.debug("Request head refused (%d): %s.", refused.status, refused.message)
                self._refuse(refused.status, refused.message)
            else:
                self._framing_error(f"malformed HTTP request: {error}")
            return
        if self._heads != heads:
            self._head_bytes = 0
        elif self._in_message and self._open_body is None and self._current is None:
            self._arm_head_timer()  # a head begun and not complete in this read
        if self._in_message and self._open_body is None and self._head_bytes > MAX_HEAD_BYTES:
            log.warning("Request head over %d bytes: refused (431).", MAX_HEAD_BYTES)
            self._refuse(431, f"request line and headers over {MAX_HEAD_BYTES} bytes")
        self._update_reading()

    def body_read(self) -> None:
        """A handler took the body bytes held: reading may resume."""
        if self._reading_paused:
            self._update_reading()

    def _update_reading(self) -> None:
        body = self._open_body
        pause = (
            bool(self._queue)
            or self._no_more
            or (body is not None and body.held() > BODY_HIGH_WATER)
        )
        transport = self.transport
        if transport is None or pause == self._reading_paused or transport.is_closing():
            return
        self._reading_paused = pause
        if pause:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` and close, after the requests parsed before it are answered."""
        self._no_more = True
        self._refusal = refusal(status, message)
        if self._current is None:
            self._send_refusal()

    def _framing_error(self, message: str) -> None:
        """Bytes llhttp cannot parse: 400 and close. A request whose body they broke is dropped
        if queued (after the answers before it); if handled, its body read fails now and the
        400 is its answer unless that began (nothing waits for ``body_timeout_s``)."""
        body, self._open_body = self._open_body, None
        self._in_message = False
        if body is not None and body.answered and body is not self._current:
            self._no_more = True  # a body its answer did not need: nothing more to say
            self.close()
            return
        if body is None or body is not self._current:
            if body is not None and self._queue and self._queue[-1] is body:
                self._queue.pop()
            self._refuse(400, message)
            return
        self._no_more = True
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if not body.began:
            body.began = True  # the refusal is the answer: the handler writes nothing more
            self.write_raw(refusal(400, message))
        self.close()  # the handler's body read fails

    def _send_refusal(self) -> None:
        answer, self._refusal = self._refusal, None
        if answer is not None:
            self.write_raw(answer)
        self.close()

    # ------------------------------------------------------------------ llhttp callbacks

    def on_message_begin(self) -> None:
        self._in_message = True
        self._url = []
        self._fields = {}
        self._hosts = []
        self._codings = []
        self._idle_since = None  # a request begins: no longer idle

    def on_url(self, url: bytes) -> None:
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._open_body is not None:
            return  # a chunked body's trailer field: never one of the request's headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").rstrip(" \t")  # OWS is not the value (RFC 9112 §5)
        if key == "host":
            self._hosts.append(text)
        elif key == "transfer-encoding":
            self._codings.append(text)
        self._fields.setdefault(key, text)

    def on_headers_complete(self) -> None:
        self._heads += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        parser = self._parser
        text = parser.get_http_version()
        version = (1, 1) if text == "1.1" else (int(text[0]), int(text[-1]))
        refused = head_refusal(version, self._hosts, self._codings)
        if refused is not None:
            self._refused = refused
            raise refused  # llhttp stops here: nothing after this head is parsed
        url = self._url[0] if len(self._url) == 1 else b"".join(self._url)
        request = EdgeRequest(
            self,
            parser.get_method().decode("latin-1"),
            target_path(url),
            version,
            Headers(self._fields),
            parser.should_keep_alive(),
        )
        self._open_body = request
        if self._current is None and not self._queue:
            self._start(request)
        else:
            self._queue.append(request)

    def on_body(self, body: bytes) -> None:
        request = self._open_body
        if request is not None:
            request.feed(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        request, self._open_body = self._open_body, None
        if request is None:
            return
        request.end_body()
        if request is self._current and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if request is not self._current and self._current is None and not self._queue:
            self._after_answer()  # the end of a body its answer left unread

    # ------------------------------------------------------------------ handling

    def _start(self, request: EdgeRequest) -> None:
        self._current = request
        limit = self.settings.body_timeout_s
        if limit > 0 and not request.complete:
            self._body_timer = self._loop.call_later(limit, self._body_timed_out, request)
        self.server.run(self._handle(request))

    async def _handle(self, request: EdgeRequest) -> None:
        try:
            response = await self.server.handler(request)
            if response is not None and not request.began:
                request.respond(response.status, response.headers, response.body)
                await self._drain_bounded()
        except asyncio.CancelledError:
            self._answered(request)
            raise
        except OSError:
            pass  # the client's connection is gone: nothing to answer
        except Exception:
            log.exception("request handler failed")
            if not request.began:
                body = wire.error_body(500, "internal router error", "internal_error")
                headers = {"content-type": "application/json"}
                with contextlib.suppress(OSError):
                    request.respond(500, headers, body)
        self._answered(request)

    async def _drain_bounded(self) -> None:
        """A whole answer's drain, bounded by ``write_timeout_s`` (then the connection is
        aborted: the client is not reading)."""
        if not self.writing_paused:
            return
        limit = self.settings.write_timeout_s
        try:
            async with asyncio.timeout(limit if limit > 0 else None):
                await self.drain()
        except TimeoutError:
            self.abort()

    def _answered(self, request: EdgeRequest) -> None:
        if self._current is not request:
            return
        self._current = None
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
        if self._lost:
            return
        if not request.answered or not request.keep_alive or self._eof or self.server.shutting_down:
            self.close()
            return
        if not request.complete:  # a body the answer did not need: read and dropped
            if self._body_timer is None:  # no bound on it: close instead
                self.close()
            return
        self._after_answer()

    def _after_answer(self) -> None:
        """The connection is free again: the next request, a pending refusal, or idle time."""
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if self._queue:
            self._start(self._queue.popleft())
        elif self._refusal is not None or self._no_more:
            self._send_refusal()  # (the refusal, if any, then the close)
            return
        elif self._in_message:  # a next head has begun (it came with the last request)
            self._arm_head_timer()
        else:
            self._arm_idle()
        self._update_reading()

    # ------------------------------------------------------------------ timers

    def _arm_idle(self) -> None:
        """Idle from now. One timer serves every idle period: one that finds the connection
        busy, or idle for less than the bound, is armed again for the rest (so a request costs
        a clock read, not a timer)."""
        self._idle_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self.settings.idle_timeout_s, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None or self._lost:
            return  # busy: the answer's end arms it again
        left = since + self.settings.idle_timeout_s - self._loop.time()
        if left > 0:
            self._idle_timer = self._loop.call_later(left, self._idle_check)
        elif self.writing_paused:
            self.abort()  # an answer its client never read: nothing to wait for
        else:
            self.close()

    def _arm_head_timer(self) -> None:
        limit = self.settings.head_timeout_s
        if limit > 0 and self._head_timer is None:
            self._head_timer = self._loop.call_later(limit, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._current is not None or self._lost:
            return
        log.warning("Request head not complete in client.head_timeout_s: 408.")
        limit = self.settings.head_timeout_s
        self.write_raw(
            refusal(408, f"request head not complete within {limit:g} s (client.head_timeout_s)")
        )
        self.close()

    def _body_timed_out(self, request: EdgeRequest) -> None:
        self._body_timer = None
        if request.complete or self._lost:
            return
        if not request.written:
            limit = self.settings.body_timeout_s
            log.warning("Request body not complete in client.body_timeout_s: 408.")
            message = f"request body not complete within {limit:g} s (client.body_timeout_s)"
            self.write_raw(refusal(408, message))
        self.close()  # the handler's body read fails


class EdgeServer:
    """Makes the :class:`EdgeConnection` of each accepted socket, and holds their handlers."""

    def __init__(
        self, handler: Handler, settings: ClientSettings, counts: ClientConnections | None = None
    ) -> None:
        self.handler = handler
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        # open, refused and reading a body (/status and /metrics read the router's)
        self.counts = counts if counts is not None else ClientConnections(0)
        self.counts.limit = settings.max_connections  # the bound in force is this server's
        self.shutting_down = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._date_at = -1
        self._date = b""

    def __call__(self) -> EdgeConnection:
        """An accepted socket's protocol."""
        return EdgeConnection(self)

    def run(self, handling: Coroutine[Any, Any, None]) -> None:
        """Run one request's handling as a task this server holds until it ends."""
        task = self.loop.create_task(handling)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def date_line(self) -> bytes:
        """The ``date`` header line, formatted once a second."""
        now = int(time.time())
        if now != self._date_at:
            self._date_at = now
            self._date = f"date: {email.utils.formatdate(now, usegmt=True)}\r\n".encode()
        return self._date

    def _connections(self) -> list[EdgeConnection]:
        """The connections open now (the counts' live set holds only this server's)."""
        return [cast(EdgeConnection, conn) for conn in self.counts.live]

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections now; give the requests in progress ``grace_s`` to end, then
        cancel their handlers (which may still answer, briefly) and wait for them; close the
        rest. Call after the listening sockets are closed."""
        self.shutting_down = True
        for conn in self._connections():
            if not conn.busy():
                conn.close()
        tasks = set(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for conn in self._connections():
            conn.close()
