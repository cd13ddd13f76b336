"""What the request log says of a prompt: its size and chained block hashes, never its text."""

from __future__ import annotations

import json

from narwhal.core.prompt_identity import LOG_BLOCK_BYTES, prompt_fields
from narwhal.core.requests import CHAT, COMPLETIONS, parse_client_request


def fields(endpoint: str, body: dict[str, object]) -> dict[str, object]:
    return prompt_fields(parse_client_request(endpoint, body, request_id="r", arrival=0.0))


def test_equal_hashes_mean_equal_prefixes_and_no_text_is_logged() -> None:
    shared = "s" * (2 * LOG_BLOCK_BYTES)
    one = fields(COMPLETIONS, {"prompt": shared + "a" * LOG_BLOCK_BYTES, "max_tokens": 9})
    two = fields(COMPLETIONS, {"prompt": shared + "b" * LOG_BLOCK_BYTES + "tail"})
    assert one["prefix"][:2] == two["prefix"][:2]  # type: ignore[index]
    assert one["prefix"][2] != two["prefix"][2]  # type: ignore[index]
    assert (len(one["prefix"]), len(two["prefix"])) == (3, 3)  # type: ignore[arg-type]
    assert (one["prompt_bytes"], two["prompt_bytes"]) == (
        3 * LOG_BLOCK_BYTES,
        3 * LOG_BLOCK_BYTES + 4,
    )
    assert (one["max_tokens"], two["max_tokens"]) == (9, None)
    assert "sss" not in json.dumps(one) and "tail" not in json.dumps(two)


def test_a_chat_is_hashed_over_its_turns_and_asks_with_max_completion_tokens() -> None:
    turn = {"role": "system", "content": "x" * LOG_BLOCK_BYTES}
    first = fields(CHAT, {"messages": [turn, {"role": "user", "content": "hi"}]})
    second = fields(
        CHAT, {"messages": [turn, {"role": "user", "content": "yo"}], "max_completion_tokens": 4}
    )
    assert first["prefix"] == second["prefix"] and len(first["prefix"]) == 1  # type: ignore[arg-type]
    assert (first["endpoint"], second["max_tokens"], first["stream"]) == (CHAT, 4, False)
