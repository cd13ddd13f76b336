"""Parsing JSON that comes from outside: client bodies, engine replies and streamed events.

Rule kept here: whatever the router parses from the network is either a JSON value nested at most
about 200 levels deep or a ``ValueError``. The standard ``json.loads`` goes as deep as Python's
recursion limit and then raises ``RecursionError``, which nothing expects: a client body of a
thousand nested brackets was a 500 with a traceback, and a reply nested just below the limit
could still make the core's recursive work (copying, validating) overflow later.

Theory of operation: :func:`parse_json` is ``pydantic_core.from_json`` (pydantic's own Rust parser,
with a fixed recursion bound). It gives the same values as ``json.loads`` for every document the
router handles (``NaN`` and ``Infinity`` are accepted like ``json.loads`` does; a duplicate key
keeps its last value); it refuses lone UTF-16 surrogates (``"\\ud800"``), which ``json.loads`` lets
through.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json


def parse_json(raw: bytes | str) -> Any:
    """The JSON value of ``raw``; ``ValueError`` when it is not JSON or nests too deeply."""
    return from_json(raw)
