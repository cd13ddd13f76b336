"""The simulated engine's bytes: vLLM's OpenAI-compatible responses, byte for byte.

Rule kept here: what a simulated engine sends is what vLLM sends (the prefill reply is a
completion body carrying NixlConnector ``kv_transfer_params``; a decode stream is SSE
``data: {...}`` chunks ending with ``data: [DONE]``; errors are OpenAI error objects), so the
router's real parsers and validators run against it. Nothing here decides anything.

Theory of operation: a stream's chunks share a head (id, object, created, model, the start of
the choice), written once per sequence by :func:`chunk_head`; each chunk is that head plus
:func:`chunk_body` (``n`` tokens of filler text, one character a token, and the finish
reason). Bodies are written as text directly rather than through ``json.dumps`` of a dict: the
same bytes, with key order and spacing fixed by the template.
"""

from __future__ import annotations

import json
from typing import Any

CREATED = 1_700_000_000  # the "created" field of engine responses (fixed: runs replay exactly)
ENGINE_VERSION = "0.32.0"
DONE = b"data: [DONE]\n\n"
ERROR_500 = (  # the in-band error event vLLM sends inside a 200 stream
    b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
    b'"param": null, "code": 500}}\n\n'
)


def error_body(status: int, message: str, kind: str) -> bytes:
    """An OpenAI error object, as vLLM answers a failed request."""
    return json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    ).encode()


def version_body() -> bytes:
    return json.dumps({"version": ENGINE_VERSION}).encode()


def models_body(model: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode()


def prompt_tokens(body: dict[str, Any]) -> int | None:
    """The simulator's tokenizer: one token per character (plus BOS), or per listed id; None
    when the body has no prompt or messages."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) + 1
    if isinstance(prompt, list) and prompt:
        return len(prompt) if isinstance(prompt[0], int) else sum(len(str(p)) for p in prompt) + 1
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return sum(len(str(m.get("content", ""))) + 4 for m in messages if isinstance(m, dict)) + 2
    return None


def chunk_head(rid: str, model_json: str, chat: bool) -> bytes:
    """The bytes every chunk of request ``rid``'s stream starts with (``model_json``: the model
    name as a JSON string)."""
    if chat:
        return (
            f'data: {{"id":"chatcmpl-{rid}","object":"chat.completion.chunk",'
            f'"created":{CREATED},"model":{model_json},"choices":[{{"index":0,"delta":'
        ).encode()
    return (
        f'data: {{"id":"cmpl-{rid}","object":"text_completion","created":{CREATED},'
        f'"model":{model_json},"choices":[{{"index":0,"text":"'
    ).encode()


def role_chunk(head: bytes) -> bytes:
    """A chat stream's first chunk: the assistant's role, no content yet."""
    return head + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'


def chunk_body(n: int, final: bool, chat: bool) -> bytes:
    """The rest of a streamed chunk after its head: ``n`` tokens of filler text."""
    if chat:
        reason = b'"length"' if final else b"null"
        return (
            b'{"content":"'
            + b"x" * n
            + b'"},"logprobs":null,"finish_reason":'
            + reason
            + b"}]}\n\n"
        )
    if final:
        return b"x" * n + b'","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
    return b"x" * n + b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'


def prefill_reply(
    rid: str,
    model_json: str,
    prompt: int,
    block_ids: list[int],
    engine_id: str,
    remote_request_id: str,
    host: str,
    port: int,
) -> bytes:
    """A producer's answer to a prefill leg: a one-token completion whose
    ``kv_transfer_params`` tell the consumer where to pull the KV of ``block_ids``."""
    ids = ",".join(map(str, block_ids))
    return (
        f'{{"id":{json.dumps("cmpl-" + rid)},"object":"text_completion",'
        f'"created":{CREATED},"model":{model_json},"choices":[{{'
        f'"index":0,"text":"x","logprobs":null,"finish_reason":"length","stop_reason":null,'
        f'"prompt_logprobs":null}}],"usage":{{"prompt_tokens":{prompt},'
        f'"total_tokens":{prompt + 1},"completion_tokens":1}},"kv_transfer_params":{{'
        f'"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[{ids}]],'
        f'"remote_engine_id":"{engine_id}","remote_request_id":{json.dumps(remote_request_id)},'
        f'"remote_host":"{host}","remote_port":{port},"tp_size":1,'
        f'"dcp_size":1,"pp_size":1,"remote_num_tokens":{prompt},'
        f'"remote_blocks_expiry_time":null,"transfer_mode":"pull",'
        f'"remote_prefill_cached_tokens":0}}}}'
    ).encode()
