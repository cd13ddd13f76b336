"""json_copy: equal to its source, sharing no mutable container with it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.jsoncopy import json_copy

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def containers(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in containers(v))]
    return []


@settings(derandomize=True, max_examples=200)
@given(JSON)
def test_copy_is_equal_and_detached(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value
    assert not set(containers(copied)) & set(containers(value))


def test_non_json_values_fall_back_to_deepcopy() -> None:
    value = {"t": (1, [2])}
    copied = json_copy(value)
    assert copied == value and copied["t"][1] is not value["t"][1]
