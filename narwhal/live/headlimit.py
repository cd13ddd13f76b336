"""A bound on the size of a request's head (request line and headers) for the router's server.

Rule kept here: a connection whose request head is still incomplete once more than
:data:`MAX_HEAD_BYTES` of it have arrived is answered 431 (an OpenAI error object) and closed;
nothing else about aiohttp's request handler changes.

Why: aiohttp's own limits are per line and per header field (and a 400 in plain text); a head
is bounded as a whole here, as vLLM's server (h11) bounds it at 16 KiB. Its C parser joins a
header value piece by piece as reads arrive, so the work on one head grows faster than the head:
without a bound a client trickling a 150 MB header keeps the event loop busy enough that health
checks time out and healthy engines are ejected.

Theory of operation: bytes received while no request body is open are counted (a head starts the
connection and follows each complete body); they are fed to the parser first, so a head and body
arriving in one read are never mistaken for a long head. A read in which the parser completed a
head (aiohttp's request count grew) starts the count again; a head still incomplete past the
bound after a read is refused. So the parser never works on more than the bound plus one read
(asyncio and uvloop read at most 256 KiB) of one head; aiohttp's per-line limits are set to
:data:`PARSER_LINE_LIMIT`, above that, so it is this bound, never the parser's 400, that
answers an oversized head, and a head that completes within the read that crosses the bound is
served.
"""

from __future__ import annotations

import logging

from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from narwhal.core import wire

MAX_HEAD_BYTES = 64 * 1024
PARSER_LINE_LIMIT = 1024 * 1024  # aiohttp's max_line_size and max_field_size: see above
PARSER_MAX_HEADERS = MAX_HEAD_BYTES // 4  # "a:\r\n": as many headers as the bound can hold

_REFUSAL = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
)

log = logging.getLogger("narwhal.live")


def _refusal() -> bytes:
    body = wire.error_body(
        431, f"request line and headers over {MAX_HEAD_BYTES} bytes", "invalid_request_error"
    )
    return _REFUSAL + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


class HeadBoundedHandler(RequestHandler):
    """aiohttp's request handler, refusing request heads over :data:`MAX_HEAD_BYTES`.

    It also tracks where the connection is (in a head, or in a body) for its subclass:
    :meth:`in_head`, and :meth:`head_completed` called after each read that completed one."""

    _head_bytes = 0
    _last_head: object = None  # the last head parsed (a RawRequestMessage, or a parse error)
    _open_body: StreamReader | None = None  # its body

    def in_head(self) -> bool:
        """No body is arriving: the next byte is part of a request head."""
        body = self._open_body
        return body is None or body.is_eof()

    def head_completed(self) -> None:
        """Called after a read in which the parser completed a request head."""

    def data_received(self, data: bytes) -> None:
        in_head = self.in_head()
        if in_head:
            self._head_bytes += len(data)
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:  # heads completed in this read
            self._head_bytes = 0
            self._last_head, self._open_body = self._messages[-1]
            self.head_completed()
            in_head = self.in_head()
        transport = self.transport
        if (
            in_head
            and self._head_bytes > MAX_HEAD_BYTES
            and transport is not None
            and not transport.is_closing()
        ):
            log.warning("Request head over %d bytes: refused (431).", MAX_HEAD_BYTES)
            transport.write(_refusal())
            self.force_close()
