"""parse_json: the values json.loads gives, and a ValueError (never a RecursionError) for JSON
nested too deeply or not JSON at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.jsonparse import parse_json

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(st.characters(exclude_categories=["Cs"])),  # no lone surrogates (see the module)
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=40,
)


@settings(derandomize=True, max_examples=300)
@given(JSON, st.booleans())
def test_same_values_as_json_loads(value: Any, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=not as_bytes)
    raw: bytes | str = text.encode() if as_bytes else text
    assert parse_json(raw) == json.loads(raw)


@pytest.mark.parametrize("depth", [250, 990, 100_000])
def test_deep_nesting_is_a_value_error(depth: int) -> None:
    with pytest.raises(ValueError, match="recursion limit exceeded"):
        parse_json(b"[" * depth + b"]" * depth)
    with pytest.raises(ValueError):
        parse_json(b'{"a":' * depth + b"1" + b"}" * depth)


def test_nesting_a_request_could_need_parses() -> None:
    deep = b"[" * 150 + b"]" * 150
    assert parse_json(deep) == json.loads(deep)


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": }', b"\xff\xfe", b"[1,]", b'"\\ud800"', b"nul"])
def test_not_json_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_json(raw)


def test_json_loads_extensions_kept() -> None:
    value = parse_json(b'{"a": 1, "a": 2, "n": NaN, "i": -Infinity, "big": 123456789012345678901}')
    assert value["a"] == 2 and value["n"] != value["n"] and value["i"] == float("-inf")
    assert value["big"] == 123456789012345678901
