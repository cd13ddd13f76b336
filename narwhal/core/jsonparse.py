"""Parsing JSON that comes from outside: client bodies, engine replies and streamed events.

Rule kept here: whatever the router parses from the network is either a JSON value nested at most
about 200 levels deep or a ``ValueError``. The standard ``json.loads`` goes as deep as Python's
recursion limit and then raises ``RecursionError``, which nothing expects: a client body of a
thousand nested brackets was a 500 with a traceback, and a reply nested just below the limit
could still make the core's recursive work (copying, validating) overflow later. A client body
is also bounded in how many values it holds, checked before it is parsed: a few megabytes of
tiny values (``[{},{},...]``) parse into a hundred megabytes of Python objects and keep the
event loop busy for a second.

Theory of operation: :func:`parse_json` is ``pydantic_core.from_json`` (pydantic's own Rust parser,
with a fixed recursion bound). It gives the same values as ``json.loads`` for every document the
router handles (``NaN`` and ``Infinity`` are accepted like ``json.loads`` does; a duplicate key
keeps its last value); it refuses lone UTF-16 surrogates (``"\\ud800"``), which ``json.loads`` lets
through. :func:`parse_bounded_json` first counts the values: outside strings, every value but
the first follows a comma or is the first item of a non-empty container, so the count is
``1 + commas + containers - empty containers`` (an empty one written ``[]`` or ``{}``; one with
whitespace inside counts as one more value). A body of fewer bytes than the bound needs no
count at all (no two values share a first byte). Counting over the raw bytes is a few
``bytes.count``: commas and brackets inside strings can only make that count higher (each
``[]`` inside a string also holds a ``[``), so only when it is over the bound are the strings
replaced by a one-byte stand-in and the count taken again, exactly.

JSON has no NaN or infinite numbers, but the parser accepts ``NaN``, ``Infinity`` and
overflowing literals (``1e400``), as ``json.loads`` does. :func:`non_finite_at` finds one in a
parsed value; what the router sends on (a client body, a producer's descriptor) is checked with
it where it comes in, so the encoder that writes engine requests never meets one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from pydantic_core import from_json

# a JSON string: quotes around anything but quotes and backslashes, or escapes
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


class TooManyValues(ValueError):
    """A body holds more JSON values than the bound; the message says how many are allowed."""


parse_json: Callable[[bytes | str], Any] = from_json
"""The JSON value of ``raw``; ``ValueError`` when it is not JSON or nests too deeply (the
parser itself: every streamed event is parsed, and a wrapper would be a Python call each)."""


def _structural(text: bytes) -> int:
    opened = text.count(b"[") + text.count(b"{")
    return 1 + text.count(b",") + opened - text.count(b"[]") - text.count(b"{}")


def value_bound(raw: bytes, limit: int) -> int:
    """An upper bound on the JSON values in ``raw``, exact once it is over ``limit`` (for valid
    JSON whose empty containers are written ``[]`` and ``{}``); keys are not values. A body no
    longer than ``limit`` bytes is under it without counting: every value has a first byte of
    its own (a scalar's first character, a container's opening bracket)."""
    if len(raw) <= limit:
        return len(raw)
    quick = _structural(raw)
    if quick <= limit:
        return quick
    return _structural(_STRING.sub(b"0", raw))


def parse_bounded_json(raw: bytes, max_values: int) -> Any:
    """:func:`parse_json` of a client body of at most ``max_values`` JSON values;
    :class:`TooManyValues` (before parsing) when it holds more."""
    if value_bound(raw, max_values) > max_values:
        raise TooManyValues(f"request body holds more than {max_values} JSON values")
    return from_json(raw)


_NESTED_OR_FLOAT = (float, dict, list)  # what may hold a non-finite number


def non_finite_at(value: Any) -> str | None:
    """Where the first NaN or infinite number in a JSON value is (``logit_bias.5``,
    ``x[1]``; ``""`` for the value itself), or None when every number is finite."""
    found = _non_finite(value)
    if found is None:
        return None
    path = ""
    for part in reversed(found):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    return path


def _non_finite(value: Any) -> list[str | int] | None:
    """The path, innermost part first, to the first non-finite number (built only once one
    is found), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, _NESTED_OR_FLOAT):
                found = _non_finite(item)
                if found is not None:
                    found.append(str(key))
                    return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, _NESTED_OR_FLOAT):
                found = _non_finite(item)
                if found is not None:
                    found.append(index)
                    return found
    return None
