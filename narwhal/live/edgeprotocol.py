"""The router's HTTP/1 connections: uvicorn's httptools protocol with the time and count bounds
an edge needs, half-closing clients served, and HTTP/1.0 streams a 1.0 client can read.

Rule kept here (``[client]`` settings, docs/live.md "Limits at the edge"):

- a connection with no request in progress is closed after ``idle_timeout_s``, from its accept
  as well as after each response (uvicorn's keep-alive timer covers only the latter);
- a request head not complete ``head_timeout_s`` after its first byte is answered 408 and closed;
- a request body not complete ``body_timeout_s`` after the request started is answered 408 (an
  OpenAI error object) and closed, and the app sees a disconnect; when the app has already
  answered (a 401 needs no body), the connection is just closed;
- with ``max_connections`` open, one more is closed as soon as it is accepted;
- a client that half-closes (EOF) after a complete request still gets its answer, then the
  connection closes, and a client that closed its socket entirely is still noticed and its
  request cancelled (within about :data:`GONE_PROBE_MAX_S` while its answer has not begun, at the
  next write after); an EOF anywhere else (mid-head, mid-body, between requests) is a
  disconnect at once, as before;
- a response without ``content-length`` to an HTTP/1.0 request is sent unframed and ended by
  closing the connection (HTTP/1.0 has no chunked encoding; uvicorn would chunk it).

Why: without these a slowloris head or a 1-byte/s body holds a connection forever, and enough
such sockets exhaust the router's descriptors, which its own connections to the engines need (an
engine it cannot dial would be charged for it). None of this reaches the core: a request cut
here never started, so no engine is charged and no reservation was taken.

Theory of operation: a head timer is armed by the first byte of a head that arrives while no
response is being written, and cancelled by ``on_headers_complete``; a body timer is armed when
a request's app task starts with its body still arriving (so a pipelined request queued behind
another is not timed while uvicorn is not reading it) and cancelled by ``on_message_complete``.
A timer that fires writes its 408 straight to the transport unless the response already
started, marks the request disconnected (so the app's ``receive`` returns ``http.disconnect``
and its ``send`` writes nothing) and closes. ``eof_received`` returns True (keep the transport
open to write) only while a complete request awaits its answer, and turns off keep-alive so
uvicorn closes after the answer. An EOF cannot tell a half-close from a close (both are a FIN);
only a write can, so until the answer begins an HTTP/1.1 client is sent interim
``100 Continue`` responses, at the EOF and then at doubling intervals: a closed socket answers
one with a reset and the write after it fails, which uvicorn reports to the app as a
disconnect (HTTP/1.0 allows no interim response: a 1.0 client that closed is noticed when its
answer is written). An HTTP/1.0 request's cycle is a :class:`_CloseDelimitedCycle`.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn._types import ASGI3Application, ASGISendEvent
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from narwhal.core import wire
from narwhal.core.config import ClientSettings
from narwhal.live.headlimit import BoundedHttpToolsProtocol

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
GONE_PROBE_FIRST_S = 0.05  # after the probe written at the EOF itself
GONE_PROBE_MAX_S = 1.0  # a client gone is noticed within about this
REQUEST_TIMEOUT_HEAD = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"


def _timeout_response(message: str) -> bytes:
    body = wire.error_body(408, message, "invalid_request_error")
    return (
        REQUEST_TIMEOUT_HEAD
        + b"connection: close\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def _unframed(message: ASGISendEvent, method: str) -> bool:
    """A response start that uvicorn would send chunked: no length, and a body to come."""
    if message["type"] != "http.response.start" or method == "HEAD":
        return False
    if message["status"] in (204, 304):
        return False
    return not any(
        name.lower() in (b"content-length", b"transfer-encoding")
        for name, _ in message.get("headers", ())
    )


class _CloseDelimitedCycle(RequestResponseCycle):
    """uvicorn's request-response cycle for an HTTP/1.0 request: a response without a length is
    written as it comes and ended by closing the connection, never chunked."""

    close_delimited = False

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started or not self.close_delimited:
            if not self.response_started and _unframed(message, self.scope["method"]):
                self.close_delimited = True
                self.chunked_encoding = False  # uvicorn adds no transfer-encoding header
            await super().send(message)
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if message["type"] != "http.response.body" or self.response_complete:
            raise RuntimeError(f"unexpected ASGI message {message['type']!r} in the body")
        body = message.get("body", b"")
        if body:
            self.transport.write(body)
        if not message.get("more_body", False):
            self.response_complete = True
            self.message_event.set()
            self.transport.close()  # the end of the body, for HTTP/1.0
            self.on_response()


class EdgeHttpProtocol(BoundedHttpToolsProtocol):
    """The router's protocol; :func:`edge_protocol` binds it to the ``[client]`` settings."""

    settings: ClassVar[ClientSettings] = ClientSettings()

    _head_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_cycle: RequestResponseCycle | None = None
    _probe_timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.settings.idle_timeout_s  # type: ignore[assignment]

    # ------------------------------------------------------------------ connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.settings.max_connections:
            self.logger.debug("Over client.max_connections: connection closed.")
            transport.close()
            return
        # idle from the accept: the same timer uvicorn arms after each response
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self._probe_timer is not None:
            self._probe_timer.cancel()
        self._cancel_head_timer()
        self._cancel_body_timer()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio allows a bool
        cycle = self.cycle
        if (
            cycle is not None
            and not cycle.more_body
            and not cycle.response_complete
            and self._head_bytes == 0
        ):
            cycle.keep_alive = False  # nothing more can come: close once the answer is out
            if cycle.scope["http_version"] != "1.0":  # HTTP/1.0 takes no interim responses
                self._probe(GONE_PROBE_FIRST_S)
            return True  # keep the transport open for writing
        return None  # a disconnect: the transport closes

    def _probe(self, next_s: float) -> None:
        """Write one interim ``100 Continue`` while the answer has not begun, then again after
        ``next_s`` (doubling up to :data:`GONE_PROBE_MAX_S`). A client that half-closed reads
        past it (every HTTP/1.1 client must); one that closed its socket entirely answers the
        write with a reset, which fails a later write and disconnects the request as before."""
        self._probe_timer = None
        cycle = self.cycle
        # with requests queued behind it, self.cycle is not the one writing now: write nothing
        if cycle is None or cycle.response_started or self.pipeline or self.transport.is_closing():
            return
        self.transport.write(CONTINUE)
        self._probe_timer = self.loop.call_later(
            next_s, self._probe, min(2 * next_s, GONE_PROBE_MAX_S)
        )

    # ------------------------------------------------------------------ the head

    def data_received(self, data: bytes) -> None:
        limit = self.settings.head_timeout_s
        if self._in_head and self._head_timer is None and limit > 0 and data and self._idle():
            self._head_timer = self.loop.call_later(limit, self._head_timed_out)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._cancel_body_timer()
        super().on_message_complete()

    def _idle(self) -> bool:
        """No response being written: a 408 can go out now. (A head begun while one is written,
        pipelined, is timed from the next byte after it, or closed by the idle timer.)"""
        return self.cycle is None or self.cycle.response_complete

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        self.logger.warning("Request head not complete in client.head_timeout_s: 408.")
        limit = self.settings.head_timeout_s
        self.transport.write(
            _timeout_response(
                f"request head not complete within {limit:g} s (client.head_timeout_s)"
            )
        )
        self.transport.close()

    # ------------------------------------------------------------------ the body

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        if cycle.scope["http_version"] == "1.0":
            # a subclass that only overrides send(); swapped before the task reads cycle.send
            cycle.__class__ = _CloseDelimitedCycle
        limit = self.settings.body_timeout_s
        if cycle.more_body and limit > 0:
            self._cancel_body_timer()
            self._body_cycle = cycle
            self._body_timer = self.loop.call_later(limit, self._body_timed_out)
        super()._start_asgi_task(cycle, app)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._body_cycle = None

    def _body_timed_out(self) -> None:
        cycle, self._body_cycle, self._body_timer = self._body_cycle, None, None
        if cycle is None or self.transport.is_closing():
            return
        if not cycle.response_started:
            limit = self.settings.body_timeout_s
            self.logger.warning("Request body not complete in client.body_timeout_s: 408.")
            self.transport.write(
                _timeout_response(
                    f"request body not complete within {limit:g} s (client.body_timeout_s)"
                )
            )
        cycle.disconnected = True  # the app's receive() says so; its send() writes nothing
        cycle.message_event.set()
        self.transport.close()


def edge_protocol(settings: ClientSettings) -> type[EdgeHttpProtocol]:
    """The router's protocol class for these ``[client]`` settings (uvicorn takes a class)."""
    return type("ConfiguredEdgeHttpProtocol", (EdgeHttpProtocol,), {"settings": settings})
