"""One request at the router's edge and its one response: what a handler reads, and the writer
the client sink writes through (the connection that makes them is :mod:`narwhal.live.h1server`,
seen from here only as the :class:`ClientConnection` it must be, so this module never imports
the server). Beside them, the path a request's target names (:func:`target_path`) and the
whole error answer the server writes itself, a refused head or a timeout (:func:`refusal`).

Rule kept here: a response goes out in HTTP's order, one head, then body bytes, then its end,
framed as the request's version allows: a known length as ``content-length``, a stream as
HTTP/1.1's chunked encoding, or, for HTTP/1.0 (which has no chunked encoding), unframed and
ended by the connection's close. A response that is not whole when its handler returns is never
ended as if it were: the connection closes. Nothing is written once the connection is closing.
The body's unread bytes are bounded (reading pauses at :data:`BODY_HIGH_WATER`).

Theory of operation: :class:`EdgeRequest` is made when llhttp completes a head; the parser's
body callbacks :meth:`~EdgeRequest.feed` it and one waiter future (one reader at a time) is woken
by body bytes, the body's end or the connection's loss; :meth:`~EdgeRequest.readany` returns
every piece held, ``b""`` at the end, and raises ``ConnectionResetError`` once the connection is
gone before the end. The first read of a body that is still arriving answers
``expect: 100-continue`` (HTTP/1.1 only). Writes are synchronous ``transport.write`` calls, one
per response part: :meth:`~EdgeRequest.respond` (head and body in one), or
:meth:`~EdgeRequest.hold_head` (the head is kept and goes out in the same write as the first
body bytes, :meth:`~EdgeRequest.write`, or the end, :meth:`~EdgeRequest.write_eof`). A writer
that must not outrun its client awaits :meth:`~EdgeRequest.drain`, which returns at once unless
the transport asked the connection to pause writing, and then waits for it to resume (one future)
or raises ``ConnectionResetError`` when the connection is lost. A ``HEAD`` request is answered
with the head alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Protocol, TypeVar, overload
from urllib.parse import unquote

import httptools

from narwhal.core import wire

T = TypeVar("T")

BODY_HIGH_WATER = 256 * 1024  # unread request body bytes at which the socket stops being read
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
CRLF = b"\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse a header that would end the head early or start another: a name that is not
    printable ASCII without spaces and colons, a value with a line break or a NUL. The names
    and the values are each checked joined, with string methods (each one pass in C)."""
    names = "".join(headers)
    values = "".join(headers.values())
    if (
        "" in headers
        or not (names.isascii() and names.isprintable())
        or " " in names
        or ":" in names
        or "\r" in values
        or "\n" in values
        or "\0" in values
    ):
        raise ValueError(f"header not sendable: {headers!r}")


class Headers(Mapping[str, str]):
    """A request's headers, looked up by name in any case (the first of repeated ones)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields  # lower-case names

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    @overload
    def get(self, name: str) -> str | None: ...

    @overload
    def get(self, name: str, default: str | T) -> str | T: ...

    def get(self, name: str, default: object = None) -> object:
        return self._fields.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


@dataclass(slots=True)
class Response:
    """A whole response a handler returns (written in one send by the connection)."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


_STATUS_LINES: dict[tuple[int, bool], bytes] = {}


def status_line(status: int, http11: bool) -> bytes:
    """``HTTP/1.x <status> <reason>\\r\\n``, answering in the request's version."""
    line = _STATUS_LINES.get((status, http11))
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        version = "1.1" if http11 else "1.0"
        line = _STATUS_LINES[(status, http11)] = f"HTTP/{version} {status} {reason}\r\n".encode()
    return line


def refusal(status: int, message: str) -> bytes:
    """A whole error answer (an OpenAI error object) that closes the connection."""
    body = wire.error_body(status, message, "invalid_request_error")
    head = (
        f"content-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return b"".join((status_line(status, True), head.encode(), body))


def target_path(url: bytes) -> str:
    """The request target's path, percent-decoded, without query or fragment."""
    if not url.startswith(b"/"):  # absolute form, or "*"
        parsed = httptools.parse_url(url).path
        url = parsed if parsed is not None else b"/"
    path = url.partition(b"?")[0].partition(b"#")[0].decode("latin-1")
    return unquote(path) if "%" in path else path


class DateSource(Protocol):
    """What stamps a response head: the server's ``date`` line, shared by its connections."""

    def date_line(self) -> bytes: ...


class ClientConnection(Protocol):
    """What a request needs of the client connection it arrived on
    (:class:`narwhal.live.h1server.EdgeConnection` is the one there is)."""

    @property
    def closed(self) -> asyncio.Future[None]: ...  # resolved when the connection ends

    @property
    def server(self) -> DateSource: ...

    @property
    def writing_paused(self) -> bool: ...  # the client is not reading: its buffer is over its mark

    def closing_after_answer(self) -> bool: ...

    def body_read(self) -> None: ...

    def write(self, data: bytes) -> None: ...

    def write_raw(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


class EdgeRequest:
    """One request: its head as parsed, its body as it arrives, and its response's writer."""

    __slots__ = (
        "_chunked",
        "_continue",
        "_error",
        "_held",
        "_held_head",
        "_pieces",
        "_waiter",
        "answered",
        "began",
        "closed",
        "complete",
        "conn",
        "headers",
        "keep_alive",
        "method",
        "path",
        "version",
        "written",
    )

    def __init__(
        self,
        conn: ClientConnection,
        method: str,
        path: str,
        version: tuple[int, int],
        headers: Headers,
        keep_alive: bool,
    ) -> None:
        self.conn = conn
        self.method = method
        self.path = path
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive  # both the client and HTTP allow another request after
        self.closed: asyncio.Future[None] = conn.closed  # resolved when the connection ends
        self.complete = False  # the body came to its end
        self.began = False  # the answer's status is fixed (its head may be held)
        self.written = False  # bytes of the answer reached the transport
        self.answered = False  # the whole answer was written
        self._pieces: list[bytes] = []
        self._held = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._continue = version >= (1, 1) and (headers.get("expect", "").lower() == "100-continue")
        self._held_head: bytes | None = None
        self._chunked = False

    # ------------------------------------------------------------------ the body

    def feed(self, data: bytes) -> None:
        """Body bytes from the parser (dropped once the answer is whole: nobody reads them)."""
        if self.answered:
            return
        self._pieces.append(data)
        self._held += len(data)
        self._wake()

    def held(self) -> int:
        return self._held

    def end_body(self) -> None:
        self.complete = True
        self._wake()

    def fail_body(self, error: BaseException) -> None:
        """The connection ended (or was closed) before the body's end."""
        if not self.complete and self._error is None:
            self._error = error
            self._wake()

    async def readany(self) -> bytes:
        """Every body byte held (waiting for some if none is); ``b""`` at the body's end."""
        if self._continue:
            self._continue = False
            if not self.complete and not self.began:
                self.conn.write_raw(CONTINUE)
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        pieces = self._pieces
        data = b"".join(pieces)
        self._pieces = []
        self._held = 0
        self.conn.body_read()
        return data

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ the response

    def _head(self, status: int, headers: Mapping[str, str], framing: bytes) -> bytes:
        http11 = self.version >= (1, 1)
        conn = self.conn
        lines = [status_line(status, http11), conn.server.date_line()]
        check_headers(headers)
        for name, value in headers.items():
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        lines.append(framing)
        if not self.keep_alive or conn.closing_after_answer():
            if http11:
                lines.append(b"connection: close\r\n")
        elif not http11:
            lines.append(b"connection: keep-alive\r\n")
        lines.append(CRLF)
        return b"".join(lines)

    def _send(self, data: bytes) -> None:
        self.written = True
        self.conn.write(data)

    def respond(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        """A whole response, head and body in one write."""
        if self.began:
            raise RuntimeError("respond() after the response began")
        head = self._head(status, headers, b"content-length: %d\r\n" % len(body))
        self.began = True
        self._send(head if self.method == "HEAD" or not body else b"".join((head, body)))
        self.answered = True

    def hold_head(self, status: int, headers: Mapping[str, str]) -> None:
        """Fix a streamed response's head; it goes out with the first body bytes."""
        if self.began:
            raise RuntimeError("hold_head() after the response began")
        self._chunked = self.version >= (1, 1)
        if not self._chunked:
            self.keep_alive = False  # unframed: the close ends the body
        framing = b"transfer-encoding: chunked\r\n" if self._chunked else b""
        self._held_head = self._head(status, headers, framing)
        self.began = True

    def write(self, data: bytes) -> None:
        """Body bytes of a streamed response (with its head, when that is still held)."""
        if not data:
            return
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        head, self._held_head = self._held_head, None
        self._send(data if head is None else b"".join((head, data)))

    def write_eof(self, data: bytes = b"") -> None:
        """A streamed response's last bytes and its end, in one write."""
        parts = [] if self._held_head is None else [self._held_head]
        self._held_head = None
        if self._chunked:
            if data:
                parts.extend((b"%x\r\n" % len(data), data, CRLF))
            parts.append(LAST_CHUNK)
        elif data:
            parts.append(data)
        if parts:
            self._send(b"".join(parts))
        self.answered = True

    def send_held_head(self) -> None:
        """Write a head still held, alone (a stream that ends before any body byte)."""
        head, self._held_head = self._held_head, None
        if head is not None:
            self._send(head)

    async def drain(self) -> None:
        """Wait while the client is not reading (the transport's buffer is over its mark)."""
        await self.conn.drain()

    def abort(self) -> None:
        """Drop the connection and whatever it still holds (a client not reading)."""
        self.conn.abort()

    def close(self) -> None:
        """Close the connection once what it holds is written."""
        self.conn.close()
