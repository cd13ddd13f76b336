"""Sample vLLM stream chunks and parsing helpers shared by the SSE tests
(tests/core/test_sse.py, tests/core/test_sse_classify.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from narwhal.core.sse import SseEvent, SseParser

# ---------------------------------------------------------------- realistic vLLM chunks
# Shapes as vLLM 0.32.0 sends them (docs/contract.md); compact separators as in vLLM's
# pydantic model_dump_json, json.dumps spacing for the in-band error.

COMPLETION_TOKEN = (
    '{"id":"cmpl-7f3a","object":"text_completion","created":1767225600,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":"K","logprobs":null,"finish_reason":null,"stop_reason":null}],'
    '"usage":null}'
)
COMPLETION_FINISH = (
    '{"id":"cmpl-7f3a","object":"text_completion","created":1767225600,"model":"tiny-llama",'
    '"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null}],"usage":null}'
)
CHAT_ROLE = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    '"logprobs":null,"finish_reason":null}]}'
)
CHAT_CONTENT = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"content":"z"},"logprobs":null,'
    '"finish_reason":null}]}'
)
CHAT_FINISH = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{},"logprobs":null,'
    '"finish_reason":"stop","stop_reason":null}]}'
)
CHAT_REASONING = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},'
    '"logprobs":null,"finish_reason":null}]}'
)
CHAT_TOOL_CALL = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    '"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":""}}]},'
    '"logprobs":null,"finish_reason":null}]}'
)
USAGE = (
    '{"id":"chatcmpl-9b1c","object":"chat.completion.chunk","created":1767225600,'
    '"model":"tiny-llama","choices":[],'
    '"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8}}'
)
ERROR_500 = (
    '{"error": {"message": "Internal server error", "type": "InternalServerError", '
    '"param": null, "code": 500}}'
)
ERROR_400 = (
    '{"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError", '
    '"param": null, "code": 400}}'
)


def error_event(code: Any = None, *, with_code: bool = True, message: Any = "boom") -> str:
    err: dict[str, Any] = {"message": message, "type": "InternalServerError", "param": None}
    if with_code:
        err["code"] = code
    return json.dumps({"error": err})


def parse(stream: bytes) -> list[SseEvent]:
    parser = SseParser()
    events = parser.feed(stream)
    assert parser.close() == []
    return events


def parse_chunks(chunks: list[bytes]) -> tuple[list[SseEvent], SseParser]:
    parser = SseParser()
    events: list[SseEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    return events, parser


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]
