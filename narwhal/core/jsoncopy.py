"""Copying JSON values: the detached copies the core hands out are JSON trees.

Rule kept here: a copy shares no mutable container with its source; scalars (str, int, float,
bool, None) are immutable and shared. Anything that is not plain JSON falls back to
``copy.deepcopy``, so the result is always a true deep copy.

Theory of operation: JSON trees hold no cycles and no shared objects that must stay shared, so
no memo is needed: a dict is copied and only its containers are copied in turn, and a list of
plain scalars (block ids, token ids) is copied with one slice.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

T = TypeVar("T")


# The JSON scalars, by exact built-in type (a subclass, e.g. an enum, is copied like any other
# object). A set lookup of ``type(value)`` rather than a function: a body's every value is tested.
SCALAR_TYPES: frozenset[type] = frozenset({int, str, float, bool, type(None)})


def json_copy(value: T) -> T:
    """A deep copy of a JSON value (dicts, lists, scalars)."""
    kind = type(value)
    if kind in SCALAR_TYPES:
        return value
    if kind is dict:
        source: dict[Any, Any] = value  # type: ignore[assignment]
        # a dict's copy shares its scalars; only containers are copied in turn
        copied = source.copy()
        for k, v in source.items():
            if type(v) not in SCALAR_TYPES:
                copied[k] = json_copy(v)
        return copied  # type: ignore[return-value]
    if kind is list:
        items: list[Any] = value  # type: ignore[assignment]
        # a list of scalars (block ids, token ids) is copied with one slice
        for item in items:
            if type(item) not in SCALAR_TYPES:
                return [  # type: ignore[return-value]
                    item if type(item) in SCALAR_TYPES else json_copy(item) for item in items
                ]
        return items[:]  # type: ignore[return-value]
    return copy.deepcopy(value)
