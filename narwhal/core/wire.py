"""vLLM's OpenAI wire shapes, written once: what an engine sends and what the router answers.

Rule kept here: every byte of vLLM's protocol that Narwhal *writes* comes from this module — the
simulated engine's and the emulator's replies and streams, the router's own error bodies and its
terminal SSE error event. The *reading* side is :mod:`narwhal.core.sse` (events) and
:mod:`narwhal.core.descriptor` (the KV handoff), so a shape changed here is checked there by the
same tests that run against a real vLLM. Pure: no I/O, JSON only.

Theory of operation (vLLM 0.32's OpenAI server, as the real-vLLM tests observe it):
- A streamed response is Server-Sent Events: each event one ``data: <JSON>`` line and a blank
  line (:func:`sse_event`), the last one ``data: [DONE]`` (:data:`DONE`).
- Every chunk of one stream repeats the same ``id``, ``object``, ``created`` and ``model``;
  :class:`ChunkWriter` writes that head once per stream and each chunk as head + choice, since a
  simulated engine writes one chunk per ``stream_interval`` tokens of every sequence it runs.
  A completions chunk's choice carries ``text``; a chat chunk's carries ``delta`` (the first
  chat chunk is the role chunk ``{"role": "assistant", "content": ""}``, which is not a token).
  With ``stream_options.include_usage`` the last chunk before ``[DONE]`` has ``choices: []`` and
  ``usage``.
- An error is ``{"error": {"message", "type", "param", "code"}}`` (:func:`error_object`), sent as
  an HTTP body before streaming or, inside an HTTP 200 stream, as one SSE event
  (:func:`error_event`).
- A non-streamed reply is one JSON object (:func:`completion_reply`); a producer's prefill reply
  is such a completion with one generated token and NixlConnector ``kv_transfer_params``
  (:func:`nixl_kv_params`), which the router validates and hands to the consumer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any

DONE = b"data: [DONE]\n\n"
"""The last event of every complete stream."""

ERROR_TYPES: Mapping[int, str] = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}
"""vLLM's error ``type`` by status; others fall back to :func:`error_type`'s rule."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # one, not one a call


def to_json(value: object) -> bytes:
    """Compact JSON, as vLLM's server writes it (no spaces; non-ASCII kept as UTF-8)."""
    return _ENCODER.encode(value).encode()


def json_string(text: str) -> bytes:
    """``text`` as a JSON string, byte for byte what :func:`to_json` writes: the encoder's own
    string writer, without the encoder's walk over a value (a chunk's text is written per
    chunk)."""
    return encode_basestring(text).encode()


def sse_event(payload: bytes) -> bytes:
    """One SSE event carrying ``payload`` (JSON text) as its data field."""
    return b"".join((b"data: ", payload, b"\n\n"))


def error_type(status: int) -> str:
    """vLLM's error ``type`` for an HTTP status."""
    known = ERROR_TYPES.get(status)
    if known is not None:
        return known
    return "InternalServerError" if status >= 500 else "BadRequestError"


def error_object(
    status: int,
    message: str,
    kind: str | None = None,
    *,
    param: str | None = None,
    code: object = None,
) -> dict[str, Any]:
    """An OpenAI-shaped error: ``kind`` defaults to vLLM's type for ``status`` and ``code`` to
    ``status`` (the router's own errors name their types in OpenAI's lower-case style)."""
    return {
        "error": {
            "message": message,
            "type": error_type(status) if kind is None else kind,
            "param": param,
            "code": status if code is None else code,
        }
    }


def error_body(status: int, message: str, kind: str | None = None) -> bytes:
    """:func:`error_object` as an HTTP body."""
    return to_json(error_object(status, message, kind))


def error_event(status: int, message: str, kind: str | None = None) -> bytes:
    """:func:`error_object` as the SSE event an engine (or the router) sends inside a 200 stream."""
    return sse_event(error_body(status, message, kind))


def completion_id(request_id: str, chat: bool) -> str:
    """The response ``id`` vLLM gives a request: ``cmpl-<request id>`` or ``chatcmpl-<...>``."""
    return ("chatcmpl-" if chat else "cmpl-") + request_id


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """A ``usage`` object; with ``cached_tokens`` (prompt tokens served from the prefix cache)
    its ``prompt_tokens_details``, as vLLM writes it with ``--enable-prompt-tokens-details``."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


class ChunkWriter:
    """Writes the chunks of one stream: the per-stream head is encoded once, each chunk is the
    head plus its choice."""

    __slots__ = ("_head", "_object", "_prefix", "chat")

    def __init__(self, response_id: str, model: str, created: int, *, chat: bool) -> None:
        self.chat = chat
        self._object = "chat.completion.chunk" if chat else "text_completion"
        # to_json({"id", "object", "created", "model"}) with the object still open: chunks
        # append their own fields
        self._head = b"".join(
            (
                b'{"id":',
                json_string(response_id),
                b',"object":"',
                self._object.encode(),
                b'","created":',
                str(created).encode(),
                b',"model":',
                json_string(model),
            )
        )
        self._prefix = b"".join((b"data: ", self._head, b',"choices":[{"index":0,'))

    def role_chunk(self, prompt_token_ids: Sequence[int] | None = None) -> bytes:
        """A chat stream's first chunk: the assistant's role and no content (not a token). With
        ``prompt_token_ids`` (a request's ``return_token_ids``) it carries the rendered prompt's
        ids at the chunk's top level, where vLLM's chat endpoint writes them."""
        tail = b"}]}\n\n"
        if prompt_token_ids is not None:
            tail = b"".join((b'}],"prompt_token_ids":', to_json(list(prompt_token_ids)), b"}\n\n"))
        return b"".join(
            (
                self._prefix,
                b'"delta":{"role":"assistant","content":""},"logprobs":null,',
                b'"finish_reason":null',
                tail,
            )
        )

    def token_chunk(
        self,
        text: str,
        finish_reason: str | None = None,
        token_ids: Sequence[int] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> bytes:
        """A chunk carrying generated ``text``; ``finish_reason`` on the last one. With
        ``token_ids`` (a request's ``return_token_ids``) the choice also carries the ids of
        ``text`` and, on the stream's first chunk, ``prompt_token_ids``, as vLLM writes them (a
        chat stream's prompt ids ride on its role chunk instead: :meth:`role_chunk`)."""
        encoded = json_string(text)
        finish = b"null" if finish_reason is None else json_string(finish_reason)
        if self.chat:
            parts = (b'"delta":{"content":', b'},"logprobs":null,"finish_reason":', b"}]}\n\n")
        else:
            parts = (
                b'"text":',
                b',"logprobs":null,"finish_reason":',
                b',"stop_reason":null}]}\n\n',
            )
        end = parts[2]
        if token_ids is not None:  # inserted before the choice's and the chunk's closing "}]}"
            ids = [end[:-5], b',"token_ids":', to_json(list(token_ids)), end[-5:]]
            if prompt_token_ids is not None and not self.chat:
                ids[1:1] = [b',"prompt_token_ids":', to_json(list(prompt_token_ids))]
            end = b"".join(ids)
        return b"".join((self._prefix, parts[0], encoded, parts[1], finish, end))

    def usage_chunk(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> bytes:
        """The usage chunk sent before ``[DONE]`` when the client asked for usage."""
        body = to_json(usage(prompt_tokens, completion_tokens, cached_tokens))
        return sse_event(b"".join((self._head, b',"choices":[],"usage":', body, b"}")))


def completion_reply(
    response_id: str,
    model: str,
    created: int,
    text: str,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    chat: bool = False,
    kv_transfer_params: Mapping[str, Any] | None = None,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """A non-streamed completion (or chat completion), ``kv_transfer_params`` included as vLLM
    includes it (``null`` when the request asked for no transfer); ``cached_tokens`` as in
    :func:`usage`."""
    choice: dict[str, Any]
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": "length",
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "prompt_logprobs": None,
        }
    return {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
        "kv_transfer_params": None if kv_transfer_params is None else dict(kv_transfer_params),
    }


def nixl_kv_params(
    *,
    block_ids: Sequence[int],
    engine_id: str,
    request_id: str,
    host: str,
    port: int,
    num_tokens: int,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a NixlConnector producer returns with its prefill: where the
    prompt's KV blocks are (one KV group, tensor-parallel size 1) and how to pull them;
    ``remote_prefill_cached_tokens`` is the prompt tokens the producer found in its prefix cache
    (the consumer reports them as its own ``cached_tokens``)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(block_ids)],
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": num_tokens,
        "remote_blocks_expiry_time": None,
        "transfer_mode": "pull",
        "remote_prefill_cached_tokens": cached_tokens,
    }


_DECIMALS: dict[int, bytes] = {}
"""The decimal text of each integer :func:`int_items` has written: block ids, small integers
written by the thousand per second, whose ``str`` costs more than the rest of a reply's fields
(a pool's block ids, so at most a pool's size of entries)."""


def int_items(values: Sequence[int]) -> bytes:
    """The items of a JSON list of integers, comma-separated, without the brackets."""
    try:
        return b",".join(map(_DECIMALS.__getitem__, values))
    except KeyError:
        _DECIMALS.update((value, str(value).encode()) for value in values)
        return b",".join(map(_DECIMALS.__getitem__, values))


def prefill_reply(
    response_id: str,
    model: str,
    created: int,
    *,
    prompt_tokens: int,
    block_ids: Sequence[int],
    engine_id: str,
    request_id: str,
    host: str,
    port: int,
    cached_tokens: int | None = None,
    text: str = "x",
) -> bytes:
    """A NixlConnector producer's reply to the router's one-token prefill: one generated token
    (discarded by the router) and the KV handoff descriptor; byte for byte
    ``to_json(completion_reply(..., kv_transfer_params=nixl_kv_params(...)))``, written from
    its constant parts and the fields that vary (a simulated producer writes one per request;
    encoding the dict costs several times the rest of the reply's work)."""
    details = (
        b""
        if cached_tokens is None
        else b"".join((b',"prompt_tokens_details":{"cached_tokens":', b"%d" % cached_tokens, b"}"))
    )
    return b"".join(
        (
            b'{"id":',
            json_string(response_id),
            b',"object":"text_completion","created":',
            b"%d" % created,
            b',"model":',
            json_string(model),
            b',"choices":[{"index":0,"text":',
            json_string(text),
            b',"logprobs":null,"finish_reason":"length","stop_reason":null,'
            b'"prompt_logprobs":null}],"usage":{"prompt_tokens":',
            b"%d" % prompt_tokens,
            b',"total_tokens":',
            b"%d" % (prompt_tokens + 1),
            b',"completion_tokens":1',
            details,
            b'},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,'
            b'"remote_block_ids":[[',
            int_items(block_ids),
            b']],"remote_engine_id":',
            json_string(engine_id),
            b',"remote_request_id":',
            json_string(request_id),
            b',"remote_host":',
            json_string(host),
            b',"remote_port":',
            b"%d" % port,
            b',"tp_size":1,"dcp_size":1,"pp_size":1,"remote_num_tokens":',
            b"%d" % prompt_tokens,
            b',"remote_blocks_expiry_time":null,"transfer_mode":"pull",'
            b'"remote_prefill_cached_tokens":',
            b"%d" % (cached_tokens or 0),
            b"}}",
        )
    )
