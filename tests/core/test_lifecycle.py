"""The request lifecycle over the whole fault x phase matrix, with scripted engines.

For each fault, with and without a retry available: the client's outcome (status, or the
terminal SSE event after commit), whether the engine is charged, the attempts made (fresh
backend request ids each), and every reservation released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from narwhal.core.errors import DONE_BEFORE_TOKEN_TEXT, SILENCE_TEXT
from tests.core.lifecycle_harness import (
    D0,
    D1,
    P0,
    P1,
    SILENT_AFTER_TOKEN,
    assert_clean,
    charged_engines,
    serve,
)
from tests.core.scripted import (
    DONE,
    USAGE_CHUNK,
    Decode,
    Prefill,
    descriptor,
    inband_error,
    token,
)


@dataclass(frozen=True)
class Case:
    name: str
    scripts: dict[str, list[Any]]
    status: int
    charged: str | None  # "prefill" | "decode" | None
    retryable: bool
    committed: bool = False
    message: str | None = None


CASES = [
    Case("refused_prefill", {"prefill": [Prefill(connect="refused")]}, 502, "prefill", True),
    Case("refused_decode", {"decode": [Decode(connect="refused")]}, 502, "decode", True),
    Case("reset_prefill", {"prefill": [Prefill(connect="reset")]}, 502, "prefill", True),
    Case(
        "reset_decode_before_token",
        {"decode": [Decode(items=(), end="reset")]},
        502,
        "decode",
        True,
    ),
    Case("5xx_prefill", {"prefill": [Prefill(status=500)]}, 502, "prefill", True),
    Case("5xx_decode", {"decode": [Decode(status=503)]}, 502, "decode", True),
    Case("4xx_prefill", {"prefill": [Prefill(status=400)]}, 400, None, False),
    Case("4xx_decode", {"decode": [Decode(status=404)]}, 404, None, False),
    Case("malformed_prefill_json", {"prefill": [Prefill(raw=b"<html>oops")]}, 502, "prefill", True),
    Case(
        "bad_descriptor",
        {"prefill": [Prefill(kv={**descriptor(), "remote_engine_id": ""})]},
        502,
        "prefill",
        True,
    ),
    Case(
        "first_token_timeout",
        {"decode": [Decode(items=((0.1, USAGE_CHUNK),), end="hang")]},
        504,
        "decode",
        True,
    ),
    Case(
        "hang_before_headers", {"decode": [Decode(hang_before_headers=True)]}, 504, "decode", True
    ),
    Case(
        "silence_after_first_token",
        {"decode": [SILENT_AFTER_TOKEN]},
        504,
        "decode",
        False,
        committed=True,
        message=SILENCE_TEXT,
    ),
    Case(
        "close_before_done_before_token",
        {"decode": [Decode(items=(), end="eof")]},
        502,
        "decode",
        True,
    ),
    Case(
        "close_before_done_after_token",
        {"decode": [Decode(items=((0.01, token("A")),), end="eof")]},
        502,
        "decode",
        False,
        committed=True,
    ),
    Case(
        "done_before_any_token",
        {"decode": [Decode(items=((0.01, DONE),))]},
        502,
        None,  # not charged: a healthy engine answers an empty completion so
        True,
        message=DONE_BEFORE_TOKEN_TEXT,
    ),
    Case(
        "inband_error_before_token",
        {"decode": [Decode(items=((0.01, inband_error(500)), (0.0, DONE)))]},
        500,
        "decode",
        True,
    ),
    Case(
        "inband_4xx_before_token",
        {"decode": [Decode(items=((0.01, inband_error(400)), (0.0, DONE)))]},
        400,
        None,
        False,
    ),
    Case(
        "inband_error_after_token",
        {"decode": [Decode(items=((0.01, token("A")), (0.01, inband_error(503)), (0.0, DONE)))]},
        503,
        "decode",
        False,
        committed=True,
    ),
    Case(
        "inband_error_without_code",
        {"decode": [Decode(items=((0.01, inband_error(None)),))]},
        502,
        "decode",
        True,
    ),
    Case("handoff_too_old", {"prefill": [Prefill(delay=5.0)]}, 504, "prefill", True),
    Case(
        "malformed_sse",
        {"decode": [Decode(items=((0.01, b"data: {not json\n\n"),))]},
        502,
        "decode",
        True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fault_without_retry(case: Case) -> None:
    out = serve(case.scripts, max_attempts=1)
    assert out.record is not None
    assert out.record.attempts == 1
    assert out.record.status == case.status
    assert out.record.committed == case.committed
    if case.committed:
        assert out.sink.status == 200
        *tokens, last = out.sink.data_events()
        assert tokens and all("choices" in t for t in tokens)
        assert last["error"]["code"] == case.status
        if case.message:
            assert last["error"]["message"].startswith(case.message)
        assert out.sink.ended and out.sink.events[-1].startswith(b"data: {"), (
            "the terminal event is the body's end"
        )
    else:
        assert out.sink.status == case.status
        assert out.sink.body is not None and "error" in out.sink.body
        if case.message:
            assert out.sink.body["error"]["message"] == case.message
    charged = charged_engines(out)
    if case.charged is None:
        assert charged == set()
    else:
        (engine,) = charged
        assert engine in ((P0, P1) if case.charged == "prefill" else (D0, D1))
    assert_clean(out)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fault_with_retry_available(case: Case) -> None:
    out = serve(case.scripts, max_attempts=2)
    assert out.record is not None
    if case.retryable:
        assert out.record.attempts == 2
        assert out.record.status == 200
        assert [e["choices"][0]["text"] for e in out.sink.data_events()[:-1]] == ["A", "B"]
        # the retry went elsewhere: the failed engine is not reused while another is eligible
        failed = charged_engines(out)
        assert not failed & set(out.record.engines[2:])
    else:
        assert out.record.attempts == 1
        assert out.record.status == case.status
    assert_clean(out)
