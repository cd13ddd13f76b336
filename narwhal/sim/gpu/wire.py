"""What a simulated engine reads from a request and writes back, in vLLM's shapes.

Rule kept here: the shapes are :mod:`narwhal.core.wire`'s (the router, the emulator and the
simulated engine write vLLM's protocol from that one module); this module adds only what is
the simulator's own: its tokenizer (one token per character), the filler text it generates
(one ``x`` per token) and the fixed ``created`` time, so that a run replays byte for byte.
"""

from __future__ import annotations

from typing import Any

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


def chunk_writer(rid: str, model: str, chat: bool) -> wire.ChunkWriter:
    """The writer of request ``rid``'s stream chunks."""
    return wire.ChunkWriter(wire.completion_id(rid, chat), model, CREATED, chat=chat)


def token_chunk(chunks: wire.ChunkWriter, n: int, final: bool) -> bytes:
    """A chunk of ``n`` generated tokens; the last one's finish reason is ``length`` (the
    simulator always generates ``max_tokens``)."""
    return chunks.token_chunk("x" * n, "length" if final else None)


def prefill_reply(
    rid: str,
    model: str,
    prompt: int,
    block_ids: list[int],
    engine_id: str,
    remote_request_id: str,
    host: str,
    port: int,
) -> bytes:
    """A producer's answer to a prefill leg: one generated token and the ``kv_transfer_params``
    that tell the consumer where to pull the KV of ``block_ids``."""
    params = wire.nixl_kv_params(
        block_ids=block_ids,
        engine_id=engine_id,
        request_id=remote_request_id,
        host=host,
        port=port,
        num_tokens=prompt,
    )
    reply = wire.prefill_reply(
        wire.completion_id(rid, False),
        model,
        CREATED,
        prompt_tokens=prompt,
        kv_transfer_params=params,
    )
    return wire.to_json(reply)


def version_body() -> bytes:
    return wire.to_json({"version": ENGINE_VERSION})


def models_body(model: str) -> bytes:
    return wire.to_json({"object": "list", "data": [{"id": model, "object": "model"}]})
