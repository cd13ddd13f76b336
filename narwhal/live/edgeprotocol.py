"""The router's HTTP/1 connections: aiohttp's request handler with the time and count bounds an
edge needs, half-closing clients served, and every departed client reported.

Rule kept here (``[client]`` settings, docs/live.md "Limits at the edge"):

- a connection with no request in progress is closed after ``idle_timeout_s``, from its accept
  as well as after each response (aiohttp's keep-alive timer, armed at both);
- a request head not complete ``head_timeout_s`` after its first byte is answered 408 and closed;
- a request body not complete ``body_timeout_s`` after its handler started is answered 408 (an
  OpenAI error object) and closed, and the app sees a disconnect; when the app has already
  answered (a 401 needs no body), the connection is just closed;
- with ``max_connections`` open, one more is closed as soon as it is accepted;
- a client that half-closes (EOF) after a complete request still gets its answer, then the
  connection closes, and a client that closed its socket entirely is still noticed and its
  request cancelled (within about :data:`GONE_PROBE_MAX_S` while its answer has not begun, at the
  next write after); an EOF anywhere else (mid-head, mid-body, between requests) is a
  disconnect at once;
- the connection's end is a future, :attr:`EdgeRequestHandler.closed`, that the app watches
  (:func:`narwhal.live.sink.run_with_disconnect`): aiohttp itself tells a handler nothing when
  its client leaves;
- on shutdown a request in progress has one grace period, then its handler is cancelled.

aiohttp already sends a response without a length to an HTTP/1.0 request unframed, ended by the
close (no chunked encoding), so nothing here is needed for that.

Why: without these a slowloris head or a 1-byte/s body holds a connection forever, and enough
such sockets exhaust the router's descriptors, which its own connections to the engines need (an
engine it cannot dial would be charged for it). aiohttp has the idle timer but no head or body
timer. None of this reaches the core: a request cut here never started, so no engine is charged
and no reservation was taken.

Theory of operation: a head timer is armed by the first byte of a head that arrives while no
request is being handled, and cancelled after the read that completes the head (which also ends
the idle time: the keep-alive timer is cancelled by a head's first byte and armed again by
aiohttp after the response); a body timer is armed when a request's handler starts with its body
still arriving (so a pipelined request queued behind another is not timed while it waits) and
cancelled by the body's end. A timer that fires writes its 408 straight to the transport unless
the response already began, and closes the connection, which fails the app's body read and
resolves :attr:`~EdgeRequestHandler.closed`. ``eof_received`` returns True (keep the transport
open to write) only while a complete request awaits its answer, and marks the connection to
close after it. An EOF cannot tell a half-close from a close (both are a FIN); only a write can,
so until the answer begins an HTTP/1.1 client is sent interim ``100 Continue`` responses, at the
EOF and then at doubling intervals: a closed socket answers one with a reset and a write after it
fails, which loses the connection (HTTP/1.0 allows no interim response: a 1.0 client that closed
is noticed when its answer is written).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web_server
from aiohttp.http import HttpVersion11
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from narwhal.core import wire
from narwhal.core.config import ClientSettings
from narwhal.live.headlimit import PARSER_LINE_LIMIT, PARSER_MAX_HEADERS, HeadBoundedHandler

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
GONE_PROBE_FIRST_S = 0.05  # after the probe written at the EOF itself
GONE_PROBE_MAX_S = 1.0  # a client gone is noticed within about this
REQUEST_TIMEOUT_HEAD = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"

log = logging.getLogger("narwhal.live")


def _timeout_response(message: str) -> bytes:
    body = wire.error_body(408, message, "invalid_request_error")
    return (
        REQUEST_TIMEOUT_HEAD
        + b"connection: close\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class EdgeRequestHandler(HeadBoundedHandler):
    """One client connection; :class:`EdgeServer` makes it with the ``[client]`` settings."""

    def __init__(self, manager: EdgeServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._edge = manager  # aiohttp forgets its manager when the connection is lost
        self.settings = manager.settings
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._head_timer: asyncio.TimerHandle | None = None
        self._probe_timer: asyncio.TimerHandle | None = None
        self._unanswered = 0  # heads parsed whose handler has not finished
        self._answering: BaseRequest | None = None  # the request whose handler runs

    # ------------------------------------------------------------------ connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._edge.open_connections += 1
        if self._edge.open_connections > self.settings.max_connections:
            log.debug("Over client.max_connections: connection closed.")
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._edge.open_connections -= 1
        for timer in (self._probe_timer, self._head_timer):
            if timer is not None:
                timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)
        super().connection_lost(exc)

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio allows a bool
        """Keep the transport open for writing only while a complete request awaits its
        answer (a half-close); anything else is a disconnect: the transport closes."""
        head = self._last_head
        if (
            not self._unanswered  # between requests
            or self._head_bytes  # in the middle of a next head
            or not isinstance(head, RawRequestMessage)
            or not self.in_head()  # in the middle of its body
        ):
            return False
        self.close()  # nothing more can come: close once the answer is out
        if head.version >= HttpVersion11:  # HTTP/1.0 takes no interim responses
            self._probe(GONE_PROBE_FIRST_S)
        return True

    def _probe(self, next_s: float) -> None:
        """Write one interim ``100 Continue`` while the answer has not begun, then again after
        ``next_s`` (doubling up to :data:`GONE_PROBE_MAX_S`). A client that half-closed reads
        past it (every HTTP/1.1 client must); one that closed its socket entirely answers the
        write with a reset, which loses the connection and disconnects the request."""
        self._probe_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        request = self._answering
        if self._unanswered != 1 or (request is not None and request.writer.output_size):
            return  # the answer began, or the request writing now is not the waiting one
        transport.write(CONTINUE)
        self._probe_timer = self._loop.call_later(
            next_s, self._probe, min(2 * next_s, GONE_PROBE_MAX_S)
        )

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        """Stop the connection for the server's shutdown: a request in progress has
        ``timeout`` to finish, then its handler is cancelled (and may still answer, briefly).
        (aiohttp's own shutdown waits ``timeout`` twice before it cancels.)"""
        self._force_close = True
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        task = self._task_handler
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout)
            if not task.done():
                task.cancel()
                # its end, without taking its CancelledError for one of ours (aiohttp's
                # handler task catches every other exception itself)
                await asyncio.wait({task})
        self.force_close()

    # ------------------------------------------------------------------ the head

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count
        self._receive(data)
        self._unanswered += self._request_count - parsed

    def _receive(self, data: bytes) -> None:
        if data and self.in_head() and self._head_timer is None and self._idle():
            if self._keepalive_handle is not None:  # a request begins: no longer idle
                self._keepalive_handle.cancel()
                self._keepalive_handle = None
            limit = self.settings.head_timeout_s
            if limit > 0:
                self._head_timer = self._loop.call_later(limit, self._head_timed_out)
        super().data_received(data)

    def head_completed(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _idle(self) -> bool:
        """No request being handled: a 408 can go out now. (A head begun while one is, pipelined,
        is timed from its next byte after it, or closed by the idle timer.)"""
        return not self._unanswered

    def _head_timed_out(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        log.warning("Request head not complete in client.head_timeout_s: 408.")
        limit = self.settings.head_timeout_s
        transport.write(
            _timeout_response(
                f"request head not complete within {limit:g} s (client.head_timeout_s)"
            )
        )
        self.force_close()

    # ------------------------------------------------------------------ the body

    async def _handle_request(
        self,
        request: BaseRequest,
        start_time: float | None,
        request_handler: Callable[[BaseRequest], Awaitable[StreamResponse]],
    ) -> tuple[StreamResponse, bool]:
        limit = self.settings.body_timeout_s
        if limit > 0 and not request.content.is_eof():
            timer = self._loop.call_later(limit, self._body_timed_out, request)
            request.content.on_eof(timer.cancel)
        self._answering = request
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._answering = None
            self._unanswered -= 1

    def _body_timed_out(self, request: BaseRequest) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or request.content.is_eof():
            return
        if not request.writer.output_size:
            limit = self.settings.body_timeout_s
            log.warning("Request body not complete in client.body_timeout_s: 408.")
            transport.write(
                _timeout_response(
                    f"request body not complete within {limit:g} s (client.body_timeout_s)"
                )
            )
        self.force_close()  # the app's body read fails, and `closed` is resolved


class EdgeServer(web_server.Server):
    """aiohttp's low-level server making :class:`EdgeRequestHandler` connections."""

    def __init__(
        self,
        handler: Callable[[BaseRequest], Awaitable[StreamResponse]],
        settings: ClientSettings,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.settings = settings
        # aiohttp's own list keeps a connection until its handler's task ends: this is the
        # sockets open now, which is what the bound is on
        self.open_connections = 0

    def __call__(self) -> RequestHandler:
        return EdgeRequestHandler(
            self,
            loop=self._loop,
            keepalive_timeout=self.settings.idle_timeout_s,
            # the body's bound is body_timeout_s; aiohttp's lingering read of a body the
            # handler left unread would otherwise hold the connection 10 s past it
            lingering_time=self.settings.body_timeout_s,
            max_line_size=PARSER_LINE_LIMIT,
            max_field_size=PARSER_LINE_LIMIT,
            max_headers=PARSER_MAX_HEADERS,
            access_log=None,
            tcp_keepalive=True,
        )
