"""Compact JSON bytes for what the live router writes per request: the engine request bodies
and the request log's line (:func:`json_line`, the same ended by a newline).

Rule kept here: the bytes are the JSON of the value, compact and UTF-8 (not ASCII-escaped), for
every value the router writes; which library wrote them is never visible.

Theory of operation: orjson writes them (a small document costs it about a third of
pydantic-core's serializer's instructions, which pays a fixed cost per call). orjson refuses an
integer outside 64 bits, which a client may put in its body (a ``seed``, a ``logit_bias``
value); such a value is written by pydantic-core's serializer instead, which writes any
integer. Both write the same bytes for what both write. The numbers in a body are finite: a
client body and a producer's descriptor are refused where they come in if they hold a NaN or
an infinity (``narwhal.core.jsonparse.non_finite_at``), and the router adds none.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import to_json


def encode_json(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return to_json(value)


def json_line(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON and a newline: one line of a JSON-lines log."""
    return b"".join((encode_json(value), b"\n"))
