"""Reading a client's request body within a bound: the one body reader of the router's routes
that take a body (the inference routes, ``/tokenize`` and ``/detokenize``).

Rule kept here: no more than ``limit`` bytes of a body are ever held; a body declared larger
(``content-length``) is refused before it is read, so a client sending ``expect:
100-continue`` is told before it sends anything.

Theory of operation: :func:`read_bounded_body` returns the whole body, or None when it is (or
is declared) larger than ``limit``; the connection's loss (or its cut by
``client.body_timeout_s``) raises ``OSError`` to the caller, which knows what a lost client
means for its request. :func:`parse_body` parses it within ``admission.max_json_values``, or
raises :class:`BodyRefused` with the 413 or 400 to answer.
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.jsonparse import TooManyValues, parse_bounded_json
from narwhal.live.h1request import EdgeRequest


class BodyRefused(Exception):
    """A body the router will not take: the status and OpenAI error object to answer."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.error = error


async def read_bounded_body(request: EdgeRequest, limit: int) -> bytes | None:
    """The whole body, or None when it is larger than ``limit`` bytes (``OSError``: lost)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    while chunk := await request.readany():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


def too_large(limit: int) -> dict[str, object]:
    """The 413 error body of a body over ``admission.max_body_bytes``."""
    return wire.error_object(
        413,
        f"request body larger than {limit} bytes (admission.max_body_bytes)",
        "invalid_request_error",
    )


def parse_body(raw: bytes, max_values: int) -> Any:
    """The JSON value of a body of at most ``max_values`` values (``admission.max_json_values``),
    or :class:`BodyRefused`: 413 for too many values (counted before parsing), 400 for bad JSON."""
    try:
        return parse_bounded_json(raw, max_values)
    except TooManyValues as too_many:
        message = f"{too_many} (admission.max_json_values)"
        raise BodyRefused(413, wire.error_object(413, message, "invalid_request_error")) from None
    except ValueError as error:
        message = f"malformed JSON body: {error}"
        raise BodyRefused(400, wire.error_object(400, message, "invalid_request_error")) from None
