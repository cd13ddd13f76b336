"""Parsing an inference request into a job, or refusing it as vLLM would.

Rule kept here: a request vLLM refuses before it generates anything is refused here the same
way (HTTP 400 or 404 with vLLM's message and ``param``), before any fault is drawn or any work
is done; a request that passes becomes an :class:`InferenceJob` that says everything the
inference path needs (prompt, token counts, streaming, the handoff it produces or pulls, its
fault).

Theory of operation: :func:`parse_job` checks the JSON body, the model name, the prompt or
messages, ``max_tokens`` (``max_completion_tokens`` first; default 16) and two of vLLM's own
request checks (``stream_options`` without ``stream``, ``min_tokens`` over ``max_tokens``), so
a router that forwards what it should drop from the one-token prefill leg fails here as it would
there. A prompt that leaves no room for one token is refused; one whose ``max_tokens`` overruns
the context is clamped, as vLLM does. ``X-Request-Id`` names the response id; the phase whose
fault is drawn is ``prefill`` for a request with ``do_remote_decode`` and ``decode`` otherwise.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.types import Scope

from narwhal.core import wire
from narwhal.core.jsonparse import parse_json
from narwhal.emulator.faults import FaultBook, FaultSpec
from narwhal.emulator.state import EngineState
from narwhal.emulator.text import prompt_text, prompt_tokens

DEFAULT_MAX_TOKENS = 16


class Rejected(Exception):
    """A request refused before anything was sent (HTTP 4xx JSON)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> bytes:
        return wire.to_json(wire.error_object(self.status, self.message, param=self.param))


@dataclass
class InferenceJob:
    """One inference request, parsed."""

    chat: bool
    body: dict[str, Any]
    response_id: str
    created: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    kv: dict[str, Any] | None
    producing: bool  # a prefill leg on an engine that can produce: store and describe the KV
    pulling: bool  # a decode leg given a descriptor: pull the KV
    fault: FaultSpec | None
    cached_tokens: int = 0  # prompt tokens its prefill or pull found in the prefix cache

    def reported_cached_tokens(self, caching: bool) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` (None with prefix caching off): a
        consumer that pulled the KV reports the producer's hit, as vLLM's does."""
        if not caching:
            return None
        remote = (self.kv or {}).get("remote_prefill_cached_tokens")
        if self.pulling and type(remote) is int:
            return remote
        return self.cached_tokens

    @property
    def fault_kind(self) -> str | None:
        return self.fault.kind if self.fault else None


def _max_tokens(body: dict[str, Any], chat: bool) -> int | None:
    """The request's output limit; None: a chat that set none, which vLLM runs to the context
    length (its completions endpoint stops at :data:`DEFAULT_MAX_TOKENS`)."""
    value: object = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None if chat else DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Rejected(400, f"max_tokens must be at least 1, got {value}.", "max_tokens")
    return value


def _check_options(body: dict[str, Any], max_tokens: int) -> None:
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise Rejected(
            400, "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    min_tokens = body.get("min_tokens", 0)
    if isinstance(min_tokens, int) and min_tokens > max_tokens:
        raise Rejected(
            400,
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
            "min_tokens",
        )


def parse_job(
    state: EngineState, faults: FaultBook, scope: Scope, raw: bytes, chat: bool
) -> InferenceJob:
    """The job for one request (its fault drawn from ``faults``), or :class:`Rejected`."""
    try:
        body = parse_json(raw)
    except ValueError as error:
        raise Rejected(400, f"JSON decode error: {error}") from None
    if not isinstance(body, dict):
        raise Rejected(400, "request body must be a JSON object")
    config = state.config
    model = body.get("model")
    if model is not None and model != config.model:
        raise Rejected(404, f"The model `{model}` does not exist.", "model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Rejected(400, "messages: Field required", "messages")
    elif not isinstance(body.get("prompt"), str | list):
        raise Rejected(400, "prompt: Field required", "prompt")
    asked = _max_tokens(body, chat)
    text = prompt_text(body, chat)
    limit, prompt_length = config.max_model_len, prompt_tokens(text)
    max_tokens = max(1, limit - prompt_length) if asked is None else asked
    _check_options(body, max_tokens)
    if prompt_length >= limit:  # no room for even one token: vLLM refuses it with a 400
        raise Rejected(
            400,
            f"The decoder prompt (length {prompt_length}) is longer than the maximum model "
            f"length of {limit}.",
            "prompt",
        )
    max_tokens = min(max_tokens, limit - prompt_length)
    request_id = (
        Headers(scope=scope).get("x-request-id") or uuid.UUID(int=state.rng.getrandbits(128)).hex
    )
    kv = body.get("kv_transfer_params")
    kv = kv if isinstance(kv, dict) else None
    remote_decode = kv is not None and kv.get("do_remote_decode") is True
    pulling = kv is not None and kv.get("do_remote_prefill") is True
    options = body.get("stream_options")
    stream = body.get("stream") is True
    return InferenceJob(
        chat=chat,
        body=body,
        response_id=wire.completion_id(request_id, chat),
        created=int(time.time()),
        prompt=text,
        prompt_tokens=prompt_length,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=stream and isinstance(options, dict) and options.get("include_usage") is True,
        kv=kv,
        producing=remote_decode and config.role.produces,
        pulling=pulling,
        fault=faults.take("prefill" if remote_decode else "decode", pulling=pulling),
    )
