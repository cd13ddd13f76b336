"""Copying JSON values fast: the detached copies the core hands out are JSON trees.

Rule kept here: a copy shares no mutable container with its source; scalars (str, int, float,
bool, None) are immutable and shared. Anything that is not plain JSON falls back to
``copy.deepcopy``, so the result is always a true deep copy.

Why not ``copy.deepcopy`` everywhere: it keeps a memo and dispatches per object, which made the
descriptor's block-id lists (one int per KV block) a fifth of the simulator's run time. A list of
plain scalars is copied with one slice.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

T = TypeVar("T")
_SCALARS = frozenset({str, int, float, bool, type(None)})


def json_copy(value: T) -> T:
    """A deep copy of a JSON value (dicts, lists, scalars)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        source: dict[Any, Any] = value  # type: ignore[assignment]
        # scalars are tested inline, saving a call for each (bodies are mostly scalars)
        return {  # type: ignore[return-value]
            k: v if type(v) in _SCALARS else json_copy(v) for k, v in source.items()
        }
    if kind is list:
        items: list[Any] = value  # type: ignore[assignment]
        if _SCALARS.issuperset(map(type, items)):  # every item a scalar, checked in C
            return items[:]  # type: ignore[return-value]
        return [  # type: ignore[return-value]
            item if type(item) in _SCALARS else json_copy(item) for item in items
        ]
    return copy.deepcopy(value)
