"""The JSON the router writes per request: the value's compact UTF-8 JSON whichever library
writes it (orjson, or pydantic-core's serializer for an integer orjson refuses)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic_core import to_json

from narwhal.live.jsonwrite import encode_json, json_line

# what a client body, a descriptor or a log line can hold: text without lone surrogates (the
# parser refuses them), finite numbers (refused where they come in), integers of any size
TEXT = st.text(st.characters(exclude_categories=("Cs",)))
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(VALUES)
def test_the_bytes_are_the_values_compact_json(value: Any) -> None:
    written = encode_json(value)
    assert json.loads(written) == value
    assert written == to_json(value)  # byte for byte what pydantic-core writes
    assert json_line(value) == written + b"\n"


def test_an_integer_beyond_64_bits_is_written_too() -> None:
    body = {"prompt": "x", "seed": 2**70, "logit_bias": {"7": -(2**65)}}
    assert encode_json(body) == b'{"prompt":"x","seed":1180591620717411303424,' + (
        b'"logit_bias":{"7":-36893488147419103232}}'
    )
    assert json_line({"n": 2**64}) == b'{"n":18446744073709551616}\n'


def test_text_is_utf8_not_escaped_and_compact() -> None:
    assert encode_json({"a": ["é", "\u2028", "\x00"], "b": 1.5}) == (
        '{"a":["é","\u2028","\\u0000"],"b":1.5}'.encode()
    )
