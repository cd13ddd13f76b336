"""Client requests and the two engine legs built from them.

Rule kept here: client-supplied KV transfer parameters never reach an engine — they are dropped
when the request is parsed, before anything else sees it: the top-level ``kv_transfer_params``
and ``vllm_xargs.kv_transfer_params`` (vLLM copies ``vllm_xargs`` into a request's extra
arguments and reads the connector's parameters from there: sent on a leg that carries no
top-level ones, a same-worker decode, it would aim the engine at any host). Bodies are built
from the parsed request only. A request's body is never changed once parsed: the leg bodies are
new top-level objects that share the request's values (the prompt, the messages) rather than
copy them, so a large body is held once however many attempts and legs it takes.

Theory of operation: :func:`parse_client_request` checks the OpenAI shape just enough to route it
(the engine validates the rest and its 4xx is passed through). :func:`prefill_body` makes the
producer's one-token, non-streaming request; :func:`decode_body` the consumer's streaming request
carrying the validated descriptor, shared like the request's values (crossed decode), or no
transfer parameters (same worker).
Decode always streams upstream, so timeouts and the commit point work the same for streaming and
non-streaming clients; a non-streaming client gets the stream assembled into one response.
"""

from __future__ import annotations

from typing import Any, Final

from narwhal.core.jsoncopy import json_copy
from narwhal.core.jsonparse import non_finite_at

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT)

KV_PARAMS = "kv_transfer_params"
_PREFILL_DROPPED = ("stream_options", "min_tokens", "min_completion_tokens")


class BadRequest(ValueError):
    """The client's request cannot be routed; the message is sent back with HTTP 400."""


class ClientRequest:
    """A parsed, sanitised client request. ``body`` never holds ``kv_transfer_params``, at its
    top level or in ``vllm_xargs``."""

    __slots__ = ("arrival", "body", "endpoint", "request_id", "token_ids")

    def __init__(
        self, request_id: str, endpoint: str, body: dict[str, Any], arrival: float
    ) -> None:
        self.request_id: Final = request_id
        self.endpoint: Final = endpoint
        self.body: Final = body
        self.arrival: Final = arrival  # on the router's clock
        # the prompt's token ids as an engine's /tokenize gave them, for a text or chat prompt
        # (narwhal.core.routing.prompt_tokens; None: not asked, or no answer)
        self.token_ids: list[int] | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))


def _positive_int(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"'{key}' must be a positive integer, got {value!r}")


def _single_prompt(prompt: list[Any]) -> bool:
    """A tokenized prompt (a list of ints) or a batch of one (one string or one token list)."""
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return True
    return len(prompt) == 1 and isinstance(prompt[0], str | list)


def parse_client_request(
    endpoint: str, body: object, *, request_id: str, arrival: float, detach: bool = True
) -> ClientRequest:
    """Validate the routing-relevant shape of a client body; raise :class:`BadRequest`.

    ``detach=False``: the request takes the body's values as they are, without a copy; for a
    body the caller has just parsed and holds nowhere else (the live router's), since a deep
    copy of a large body costs as much memory and time as parsing it again."""
    if endpoint not in ENDPOINTS:
        raise BadRequest(f"unsupported endpoint {endpoint!r}")
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise BadRequest("'prompt' is required (a string or a non-empty list)")
        if isinstance(prompt, list) and not _single_prompt(prompt):
            raise BadRequest(
                "'prompt' must be one prompt (a string or a list of token ids): a prefill "
                "hands off the KV of one prompt, so batched prompts cannot be disaggregated"
            )
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' is required (a non-empty list)")
        if not all(isinstance(m, dict) for m in messages):
            raise BadRequest("each of 'messages' must be an object")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be a boolean")
    _positive_int(body, "max_tokens")
    _positive_int(body, "max_completion_tokens")
    _positive_int(body, "n")
    where = non_finite_at(body)
    if where is not None:  # no engine body can carry one: refused up front
        raise BadRequest(f"'{where}' must be a finite number (JSON has no NaN or Infinity)")
    clean = {k: v for k, v in body.items() if k != KV_PARAMS}
    xargs = clean.get("vllm_xargs")
    if isinstance(xargs, dict) and KV_PARAMS in xargs:  # a new dict: the body is not changed
        clean["vllm_xargs"] = {k: v for k, v in xargs.items() if k != KV_PARAMS}
    if detach:
        clean = json_copy(clean)
    return ClientRequest(request_id=request_id, endpoint=endpoint, body=clean, arrival=arrival)


def prefill_body(request: ClientRequest, kv_params: dict[str, Any]) -> dict[str, Any]:
    """The producer leg: one token, not streamed; the token is discarded."""
    body = {k: v for k, v in request.body.items() if k not in _PREFILL_DROPPED}
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in request.body:
        body["max_completion_tokens"] = 1
    body["kv_transfer_params"] = json_copy(kv_params)
    return body


def decode_body(request: ClientRequest, descriptor: dict[str, Any] | None) -> dict[str, Any]:
    """The consumer leg: the original request, streamed, with the validated descriptor.

    ``descriptor=None`` is same-worker decode: no transfer parameters at all. The descriptor is
    shared, not copied, as the request's values are: it is the detached copy validation made,
    and nothing changes it once made.
    """
    body = dict(request.body)
    body["stream"] = True
    if not request.stream:
        body["stream_options"] = {"include_usage": True}
    if descriptor is not None:
        body["kv_transfer_params"] = descriptor
    return body
