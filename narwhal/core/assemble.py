"""Assembling a streamed decode into the one JSON response a non-streaming client expects.

Rule kept here: only chunks the SSE classifier accepted are assembled; the result has vLLM's
non-streaming shape (``text_completion`` / ``chat.completion``), so clients cannot tell that
Narwhal streamed upstream.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.requests import CHAT


class ResponseAssembler:
    """Accumulates stream chunks (token and metadata payloads) per choice index."""

    def __init__(self, endpoint: str) -> None:
        self._chat = endpoint == CHAT
        self._head: dict[str, Any] = {}
        self._text: dict[int, list[str]] = {}
        self._reasoning: dict[int, list[str]] = {}
        self._finish: dict[int, Any] = {}
        self._usage: Any = None

    def add(self, payload: dict[str, Any]) -> None:
        if not self._head:
            self._head = {k: payload[k] for k in ("id", "created", "model") if k in payload}
        if payload.get("usage") is not None:
            self._usage = payload["usage"]
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            index = index if isinstance(index, int) else 0
            texts = self._text.setdefault(index, [])
            if self._chat:
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    texts.append(delta["content"])
                if isinstance(delta.get("reasoning_content"), str):
                    self._reasoning.setdefault(index, []).append(delta["reasoning_content"])
            elif isinstance(choice.get("text"), str):
                texts.append(choice["text"])
            if choice.get("finish_reason") is not None:
                self._finish[index] = choice["finish_reason"]

    def result(self) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for index in sorted(self._text):
            text = "".join(self._text[index])
            if self._chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if index in self._reasoning:
                    message["reasoning_content"] = "".join(self._reasoning[index])
                choice: dict[str, Any] = {"index": index, "message": message}
            else:
                choice = {"index": index, "text": text, "logprobs": None}
            choice["finish_reason"] = self._finish.get(index)
            choices.append(choice)
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
