"""What a simulated engine reads from a request and writes back, in vLLM's shapes.

Rule kept here: the shapes are :mod:`narwhal.core.wire`'s (one module writes vLLM's protocol
for the router, the emulator and the simulated engine): errors, the in-band error event,
``[DONE]`` and the GET bodies come from it as they are. The two shapes a simulated engine writes
for every request, a stream's token chunks and a producer's prefill reply, are written here
from templates of exactly core's bytes (``tests/sim/test_gpu_wire.py`` checks them against
:class:`~narwhal.core.wire.ChunkWriter` and :func:`~narwhal.core.wire.prefill_reply`); what is
the simulator's own is its tokenizer (one token per character), its filler text (one ``x`` per
token) and the fixed ``created`` time, so that a run replays byte for byte.

Theory of operation: a stream's chunks share a head (id, object, created, model, the start of
the choice), written once per sequence by :func:`chunk_head`; each chunk is that head and its
tokens (:func:`token_chunk`). A prefill reply lists its prompt's block ids from a table of their
texts that an engine sizes once (:func:`block_id_texts`). Why templates: core writes a shape by
encoding a dict, which for these two costs more than the rest of the engine's work on a request.
"""

from __future__ import annotations

from typing import Any, Final

from narwhal.core import wire

CREATED = 1_700_000_000  # the "created" field of engine responses (fixed: runs replay exactly)
ENGINE_VERSION = "0.32.0"
ERROR_500 = wire.error_event(500, "Internal server error")  # inside a 200 stream


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


def json_text(value: object) -> str:
    """``value`` as JSON text, as core writes it."""
    return wire.to_json(value).decode()


def chunk_head(rid: str, model_json: str, chat: bool) -> bytes:
    """The bytes every chunk of request ``rid``'s stream starts with (``model_json``: the model
    name as JSON text; ``rid``, the router's X-Request-Id, needs no escaping)."""
    response_id = wire.completion_id(rid, chat)
    if chat:
        return (
            f'data: {{"id":"{response_id}","object":"chat.completion.chunk",'
            f'"created":{CREATED},"model":{model_json},"choices":[{{"index":0,"delta":'
        ).encode()
    return (
        f'data: {{"id":"{response_id}","object":"text_completion","created":{CREATED},'
        f'"model":{model_json},"choices":[{{"index":0,"text":"'
    ).encode()


# What follows a chunk's filler text: the rest of the choice (its finish reason ``length`` on a
# stream's last chunk: the simulator generates ``max_tokens``) and the end of the event.
_TEXT_TAIL: Final = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
_TEXT_LAST: Final = b'","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n'
_CHAT_TAIL: Final = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
_CHAT_LAST: Final = b'"},"logprobs":null,"finish_reason":"length"}]}\n\n'
_ROLE: Final = b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'


def role_chunk(head: bytes) -> bytes:
    """A chat stream's first chunk: the assistant's role, no content yet."""
    return b"".join((head, _ROLE))


def token_chunk(head: bytes, n: int, final: bool, chat: bool) -> bytes:
    """A streamed chunk of ``n`` tokens of filler text after ``head`` (:func:`chunk_head`), the
    last of its stream if ``final``."""
    if chat:
        return b"".join((head, b'{"content":"', b"x" * n, _CHAT_LAST if final else _CHAT_TAIL))
    return b"".join((head, b"x" * n, _TEXT_LAST if final else _TEXT_TAIL))


_ID_TEXT: list[str] = []  # str(i) for the block ids 0, 1, ...: one table for every engine


def block_id_texts(num_blocks: int) -> list[str]:
    """The decimal texts of the block ids below ``num_blocks``, for :func:`prefill_reply`."""
    if len(_ID_TEXT) < num_blocks:
        _ID_TEXT.extend(map(str, range(len(_ID_TEXT), num_blocks)))
    return _ID_TEXT


def prefill_reply(
    rid: str,
    model_json: str,
    prompt: int,
    block_ids: list[int],
    id_texts: list[str],
    engine_id: str,
    remote_request_id: str,
    host: str,
    port: int,
    cached: int | None = None,
) -> bytes:
    """A producer's answer to a prefill leg: a one-token completion whose
    ``kv_transfer_params`` tell the consumer where to pull the KV of ``block_ids`` (``id_texts``:
    :func:`block_id_texts` for the engine's blocks; ``rid``, ``remote_request_id``,
    ``engine_id`` and ``host`` are plain text that needs no escaping). ``cached``: the prompt
    tokens found in the producer's prefix cache, reported in
    ``usage.prompt_tokens_details.cached_tokens`` and ``remote_prefill_cached_tokens`` (None:
    prefix caching off, no details)."""
    ids = ",".join([id_texts[block] for block in block_ids])
    details = "" if cached is None else f',"prompt_tokens_details":{{"cached_tokens":{cached}}}'
    return (
        f'{{"id":"cmpl-{rid}","object":"text_completion",'
        f'"created":{CREATED},"model":{model_json},"choices":[{{'
        f'"index":0,"text":"x","logprobs":null,"finish_reason":"length","stop_reason":null,'
        f'"prompt_logprobs":null}}],"usage":{{"prompt_tokens":{prompt},'
        f'"total_tokens":{prompt + 1},"completion_tokens":1{details}}},"kv_transfer_params":{{'
        f'"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[{ids}]],'
        f'"remote_engine_id":"{engine_id}","remote_request_id":"{remote_request_id}",'
        f'"remote_host":"{host}","remote_port":{port},"tp_size":1,'
        f'"dcp_size":1,"pp_size":1,"remote_num_tokens":{prompt},'
        f'"remote_blocks_expiry_time":null,"transfer_mode":"pull",'
        f'"remote_prefill_cached_tokens":{cached or 0}}}}}'
    ).encode()


def version_body() -> bytes:
    return wire.to_json({"version": ENGINE_VERSION})


def models_body(model: str) -> bytes:
    return wire.to_json({"object": "list", "data": [{"id": model, "object": "model"}]})
