"""The engine's tokenizer routes, ``POST /tokenize`` and ``POST /detokenize``, as vLLM serves
them (its bench client asks for them, through a router).

Rule kept here: the shapes are vLLM's: ``/tokenize`` takes ``prompt`` (a string) or ``messages``
(rendered as the inference routes render them) and answers ``{"count", "max_model_len",
"tokens", "token_strs"}``; ``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``; a model
the engine does not serve is a 404 and a bad body a 400, in vLLM's error shape, as on the
inference routes. The ids are the emulator's (:mod:`narwhal.emulator.text`): ``count`` is what
the engine counts as the prompt's tokens when it serves it.

Theory of operation: pure functions of the engine's configuration and the body; each returns
the status and the JSON body to send.
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.jsonparse import parse_json
from narwhal.emulator.state import EmulatorConfig
from narwhal.emulator.text import detokenized, prompt_text, token_ids

Answer = tuple[int, dict[str, Any]]


def _error(status: int, message: str, param: str | None = None) -> Answer:
    return status, wire.error_object(status, message, param=param)


def _body(config: EmulatorConfig, raw: bytes) -> dict[str, Any] | Answer:
    """The request's JSON object, or the refusal to answer."""
    try:
        body = parse_json(raw)
    except ValueError as error:
        return _error(400, f"JSON decode error: {error}")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != config.model:
        return _error(404, f"The model `{model}` does not exist.", "model")
    return body


def tokenize(config: EmulatorConfig, raw: bytes) -> Answer:
    """``POST /tokenize``."""
    body = _body(config, raw)
    if isinstance(body, tuple):
        return body
    chat = "messages" in body
    if chat and not (isinstance(body["messages"], list) and body["messages"]):
        return _error(400, "messages: Field required", "messages")
    if not chat and not isinstance(body.get("prompt"), str):
        return _error(400, "prompt: Input should be a valid string", "prompt")
    special = body.get("add_special_tokens", True)
    if not isinstance(special, bool):
        return _error(400, "add_special_tokens: Input should be a valid boolean")
    tokens = token_ids(prompt_text(body, chat), bos=special)
    return 200, {
        "count": len(tokens),
        "max_model_len": config.max_model_len,
        "tokens": tokens,
        "token_strs": None,
    }


def detokenize(config: EmulatorConfig, raw: bytes) -> Answer:
    """``POST /detokenize``."""
    body = _body(config, raw)
    if isinstance(body, tuple):
        return body
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        return _error(400, "tokens: Input should be a valid list of integers", "tokens")
    try:
        return 200, {"prompt": detokenized(tokens)}
    except ValueError as error:
        return _error(400, str(error), "tokens")
