"""A bound on the size of a request's head (request line and headers) for the router's server.

Rule kept here: a connection whose request head is still incomplete once more than
:data:`MAX_HEAD_BYTES` of it have arrived is answered 431 and closed; nothing else about
uvicorn's httptools protocol changes.

Why: uvicorn sets no such bound with httptools (h11 has one), and httptools joins a header's
value piece by piece, so parsing time grows faster than the header: a client trickling a
150 MB header kept the router's event loop so busy that its health checks timed out and it
ejected every healthy engine. vLLM's own server (h11) refuses a head over 16 KiB.

Theory of operation: bytes received while a head is incomplete are counted (a head starts the
connection and follows each complete request, ``on_message_complete``, and ends with
``on_headers_complete``); they are fed to the parser first, so a head and body arriving in one
read are never mistaken for a long head, and a head still incomplete past the bound after a read
is refused. So the parser
never works on more than the bound plus one read (asyncio reads up to 256 KiB) of one head: a
head that completes within the read that crosses the bound is served.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from narwhal.core import wire

MAX_HEAD_BYTES = 64 * 1024

_REFUSAL = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
)


def _refusal() -> bytes:
    body = wire.error_body(
        431, f"request line and headers over {MAX_HEAD_BYTES} bytes", "invalid_request_error"
    )
    return _REFUSAL + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing request heads over :data:`MAX_HEAD_BYTES`."""

    _head_bytes = 0
    _in_head = True  # a connection starts with a head

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.logger.warning("Request head over %d bytes: refused (431).", MAX_HEAD_BYTES)
            self.transport.write(_refusal())
            self.transport.close()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what follows is the next request's head
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
