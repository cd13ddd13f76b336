"""parse_json: the values json.loads gives, and a ValueError (never a RecursionError) for JSON
nested too deeply or not JSON at all. parse_bounded_json: the value count bounds a body before it
is parsed, exactly at the bound, whatever commas and brackets its strings hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.jsonparse import (
    TooManyValues,
    non_finite_at,
    parse_bounded_json,
    parse_json,
    value_bound,
)

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


def count_values(value: Any) -> int:
    """JSON values in a parsed document (keys are not values)."""
    if isinstance(value, dict):
        return 1 + sum(count_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(count_values(v) for v in value)
    return 1


@settings(derandomize=True, max_examples=300)
@given(JSON, st.booleans())
def test_value_bound_is_the_count(value: Any, spaced: bool) -> None:
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(value, separators=separators, ensure_ascii=False).encode()
    exact = count_values(value)
    assert value_bound(raw, 0) == exact  # over the limit: the exact count
    assert value_bound(raw, 10**9) >= exact  # the quick count may only overshoot
    assert exact <= len(raw)  # why a body of at most ``limit`` bytes needs no count
    assert parse_bounded_json(raw, exact) == json.loads(raw)
    if exact > 1:
        with pytest.raises(TooManyValues):
            parse_bounded_json(raw, exact - 1)


@pytest.mark.parametrize("n", [1, 63, 64])
def test_exactly_at_the_bound_parses_one_more_is_refused(n: int) -> None:
    raw = json.dumps({"prompt": "x", "ids": list(range(n))}).encode()  # n + 3 values
    assert parse_bounded_json(raw, n + 3)["ids"] == list(range(n))
    with pytest.raises(TooManyValues, match=f"more than {n + 2} JSON values"):
        parse_bounded_json(raw, n + 2)


def test_commas_and_brackets_inside_strings_do_not_count() -> None:
    prose = ', [{"quoted\\", \\"escaped\\"}], [] {} ' * 1000
    raw = json.dumps({"prompt": prose, "max_tokens": 4}).encode()
    assert value_bound(raw, 10) == 3  # the object, its two values
    assert parse_bounded_json(raw, 3)["prompt"] == prose


def test_a_body_of_tiny_values_is_refused_before_parsing() -> None:
    raw = b'{"prompt":"x","extra":[' + b"{}," * 999_999 + b"{}]}"
    with pytest.raises(TooManyValues):
        parse_bounded_json(raw, 262_144)


def test_strings_in_an_array_still_count_once_cut_out() -> None:
    raw = b'[""' + b',""' * 99 + b',[""],{"k":""},[],{}]'
    assert value_bound(raw, 0) == 1 + 100 + 2 + 2 + 2  # root, strings, two holders + theirs
    assert parse_bounded_json(raw, 107)[-1] == {}


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"NaN", ""),
        (b'{"a": 1e400}', "a"),
        (b'{"a": [0.5, {"b": [1, 2.5, -Infinity]}], "c": NaN}', "a[1].b[2]"),
        (b"[[1], [2, NaN]]", "[1][1]"),
        (b'{"a": [1.5, 2], "b": {"c": "NaN"}, "d": 1e308}', None),
    ],
)
def test_non_finite_at_names_the_first_one_by_its_path(raw: bytes, where: str | None) -> None:
    assert non_finite_at(parse_json(raw)) == where
