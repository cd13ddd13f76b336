"""What a request head must be, beyond what llhttp parses, before the router handles it.

Rule kept here (RFC 9112, as strict as h11): only HTTP/1.0 and HTTP/1.1 are served (else 505);
an HTTP/1.1 request names exactly one ``Host`` and an HTTP/1.0 one at most one, with a value
that is a URI host and optional port (RFC 3986; an empty value is valid, RFC 9112 §3.2), else
400; ``Transfer-Encoding`` is only ``chunked``, once: any other coding is one the router does
not implement (501, RFC 9112 §6.1), ``chunked`` twice is a framing error (400), and an HTTP/1.0
request with a ``Transfer-Encoding`` has faulty framing (400, RFC 9112 §6.1).

Why: a request whose framing two parsers read differently is how requests are smuggled past a
proxy in front of the router; a Host the router cannot read cannot be checked against
``client.allowed_hosts``; and a coding such as ``gzip, chunked``, which llhttp passes through
undecoded, would hand the handler bytes that are not the body the client meant.

Theory of operation: :class:`~narwhal.live.h1server.EdgeConnection` collects the ``Host`` and
``Transfer-Encoding`` values of a head as llhttp reports them and calls :func:`head_refusal`
when the head is complete; a refusal is raised out of the parser's callback as
:class:`HeadRefused`, which stops the parse at once (nothing after the head is parsed, so no
pipelined request behind it starts), and the connection answers it and closes.
"""

from __future__ import annotations

import re

# RFC 3986 host [":" port]: an IP literal (IPv6 or IPvFuture) or a reg-name (IPv4 included).
_HOST = re.compile(
    r"(?:\[(?:[0-9A-Fa-f:.]+|v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+)\]"
    r"|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)"
    r"(?::[0-9]*)?"
)


class HeadRefused(Exception):
    """A complete head the router refuses: the status and the message to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def valid_host(value: str) -> bool:
    """A ``Host`` value is a URI host with an optional port (RFC 9112 §3.2, RFC 3986)."""
    return _HOST.fullmatch(value) is not None


def head_refusal(
    version: tuple[int, int], hosts: list[str], transfer_codings: list[str]
) -> HeadRefused | None:
    """Why a complete head is refused (see the module's rule), or None."""
    if version != (1, 1) and version != (1, 0):
        return HeadRefused(505, f"HTTP/{version[0]}.{version[1]} is not supported")
    if transfer_codings:
        codings = [c.strip().lower() for v in transfer_codings for c in v.split(",")]
        unknown = [c for c in codings if c and c != "chunked"]
        if unknown:
            return HeadRefused(501, f"transfer coding {unknown[0]!r} is not implemented")
        if version == (1, 0):
            return HeadRefused(400, "Transfer-Encoding in an HTTP/1.0 request")
        if codings.count("chunked") != 1:
            return HeadRefused(400, "Transfer-Encoding must name chunked exactly once")
    if len(hosts) > 1:
        return HeadRefused(400, "more than one Host header field")
    if not hosts:
        if version == (1, 1):
            return HeadRefused(400, "an HTTP/1.1 request must have a Host header field")
        return None
    if not valid_host(hosts[0]):
        return HeadRefused(400, f"invalid Host header field {hosts[0]!r}")
    return None
