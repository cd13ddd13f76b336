"""Assembling a streamed decode into the one JSON response a non-streaming client expects.

Rule kept here: only chunks the SSE classifier accepted are assembled; the result has vLLM's
non-streaming shape (``text_completion`` / ``chat.completion``), so clients cannot tell that
Narwhal streamed upstream — nothing a chunk carried for a choice is dropped.

Theory of operation: each choice index accumulates what its chunks carry. Text (completions
``text``, chat ``content``, ``reasoning_content`` and ``reasoning``) is concatenated. Streamed
tool calls arrive as fragments keyed by their own ``index``: the first names the call (``id``,
``type``, ``function.name``), the rest append to ``function.arguments``; they are merged back
into whole calls, as is a legacy ``function_call``. Logprobs are concatenated list by list
(completions: ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``; chat:
``content``). ``finish_reason`` and ``stop_reason`` keep their last non-null value; ``usage`` the
last one sent.

What one answer is assembled from is bounded (``engine.max_response_bytes``, counted as the
characters of the events' data, which is bytes for the ASCII JSON engines send): an event that
would take the total past it is refused (:meth:`ResponseAssembler.add` returns False) and the
engine's answer is a malformed response (502), like one SSE event over the event bound, so a
broken engine cannot grow one request's memory without limit.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.errors import Fault, FaultKind, fault
from narwhal.core.requests import CHAT
from narwhal.core.sse import SseEvent

_TEXT_FIELDS = ("content", "reasoning_content", "reasoning")  # chat delta fields concatenated


def _merge_call(calls: dict[int, dict[str, Any]], fragment: dict[str, Any], index: int) -> None:
    """Fold one streamed tool-call fragment into the call it belongs to."""
    call = calls.setdefault(index, {})
    for key in ("id", "type"):
        if isinstance(fragment.get(key), str):
            call[key] = fragment[key]
    function = fragment.get("function")
    if isinstance(function, dict):
        merged = call.setdefault("function", {})
        if isinstance(function.get("name"), str):
            merged["name"] = merged.get("name", "") + function["name"]
        if isinstance(function.get("arguments"), str):
            merged["arguments"] = merged.get("arguments", "") + function["arguments"]


def _merge_logprobs(into: dict[str, Any], part: dict[str, Any]) -> None:
    for key, value in part.items():
        if isinstance(value, list):
            into.setdefault(key, []).extend(value)
        elif key not in into:
            into[key] = value


class _Choice:
    """Everything the chunks of one choice index carried."""

    __slots__ = ("calls", "finish", "function", "logprobs", "stop_reason", "texts")

    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {}  # field -> pieces
        self.calls: dict[int, dict[str, Any]] = {}  # tool-call index -> merged call
        self.function: dict[int, dict[str, Any]] = {}  # legacy function_call, under key 0
        self.logprobs: dict[str, Any] | None = None
        self.finish: Any = None
        self.stop_reason: Any = None

    def add_text(self, name: str, value: Any) -> None:
        if isinstance(value, str):
            self.texts.setdefault(name, []).append(value)

    def text(self, name: str) -> str | None:
        pieces = self.texts.get(name)
        return None if pieces is None else "".join(pieces)


class ResponseAssembler:
    """Accumulates stream chunks (token and metadata payloads) per choice index."""

    def __init__(self, endpoint: str, max_bytes: int) -> None:
        self._chat = endpoint == CHAT
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: Any = None
        self.max_bytes = max_bytes
        self.size = 0  # event data taken so far

    def add(self, payload: dict[str, Any], size: int) -> bool:
        """Take one event's payload (``size``: its data's length); False, taking nothing, when
        it would take the answer past ``max_bytes``."""
        if self.size + size > self.max_bytes:
            return False
        self.size += size
        if not self._head:
            self._head = {k: payload[k] for k in ("id", "created", "model") if k in payload}
        if payload.get("usage") is not None:
            self._usage = payload["usage"]
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict):
                self._add_choice(choice)
        return True

    def take(self, event: SseEvent) -> bool:
        """:meth:`add` for one classified event (one without a payload takes nothing)."""
        return event.payload is None or self.add(event.payload, len(event.data))

    def too_large(self, engine: str) -> Fault:
        """The fault of an engine whose answer outgrew ``max_bytes``."""
        return fault(
            FaultKind.MALFORMED_RESPONSE,
            f"engine's answer over engine.max_response_bytes ({self.max_bytes} bytes)",
            engine=engine,
            phase="decode",
        )

    def _add_choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        into = self._choices.get(index)
        if into is None:
            into = self._choices[index] = _Choice()
        if self._chat:
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for name in _TEXT_FIELDS:
                    into.add_text(name, delta.get(name))
                for position, fragment in enumerate(delta.get("tool_calls") or ()):
                    if isinstance(fragment, dict):
                        call_index = fragment.get("index")
                        if not isinstance(call_index, int) or isinstance(call_index, bool):
                            call_index = position
                        _merge_call(into.calls, fragment, call_index)
                if isinstance(delta.get("function_call"), dict):
                    _merge_call(into.function, {"function": delta["function_call"]}, 0)
        else:
            into.add_text("text", choice.get("text"))
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            if into.logprobs is None:
                into.logprobs = {}
            _merge_logprobs(into.logprobs, logprobs)
        if choice.get("finish_reason") is not None:
            into.finish = choice["finish_reason"]
        if choice.get("stop_reason") is not None:
            into.stop_reason = choice["stop_reason"]

    def _chat_message(self, choice: _Choice) -> dict[str, Any]:
        content = choice.text("content")
        message: dict[str, Any] = {
            "role": "assistant",
            # vLLM answers a pure tool call with null content; plain text otherwise
            "content": content if content is not None or choice.calls else "",
        }
        for name in ("reasoning_content", "reasoning"):
            value = choice.text(name)
            if value is not None:
                message[name] = value
        if choice.calls:
            message["tool_calls"] = [choice.calls[i] for i in sorted(choice.calls)]
        if choice.function:
            message["function_call"] = choice.function[0].get("function", {})
        return message

    def result(self) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for index in sorted(self._choices):
            choice = self._choices[index]
            out: dict[str, Any] = {"index": index}
            if self._chat:
                out["message"] = self._chat_message(choice)
            else:
                out["text"] = choice.text("text") or ""
            out["logprobs"] = choice.logprobs
            out["finish_reason"] = choice.finish
            if choice.stop_reason is not None:
                out["stop_reason"] = choice.stop_reason
            choices.append(out)
        body: dict[str, Any] = {
            "id": self._head.get("id", ""),
            "object": "chat.completion" if self._chat else "text_completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            "choices": choices,
        }
        if self._usage is not None:
            body["usage"] = self._usage
        return body
