"""What a simulated engine reads from a request and writes back, in vLLM's shapes.

Rule kept here: every byte a simulated engine writes comes from :mod:`narwhal.core.wire`, the
one writer of vLLM's protocol (the router, the emulator and the simulated engine use it alike);
this module holds only what is the simulator's own: its tokenizer (one token per character),
its filler text (one ``x`` per token), the fixed ``created`` time (so that a run replays byte
for byte) and the version it reports.

Theory of operation: a decode leg's stream gets one :class:`~narwhal.core.wire.ChunkWriter`
(:func:`chunk_writer`), whose per-stream head is encoded once; each chunk is that head and ``n``
tokens of filler (:func:`token_chunk`). A producer's answer to a prefill leg is core's
one-token completion with NixlConnector ``kv_transfer_params`` (:func:`prefill_reply`).
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire

CREATED = 1_700_000_000  # the "created" field of engine responses (fixed: runs replay exactly)
ENGINE_VERSION = "0.32.0"
ERROR_500 = wire.error_event(500, "Internal server error")  # inside a 200 stream
BOS_ID = 1  # the tiny model's (and the emulator's) layout: specials first, then one per character
TEXT_ID_BASE = 6  # a character's id: this plus its code point
FILLER_ID = TEXT_ID_BASE + ord("x")  # the id of the filler token
# the id of each generated token: no character's, so generated tokens replayed as a resumed
# leg's prompt are content no other prompt shares (the model's output is filler, not the text)
GENERATED_ID = TEXT_ID_BASE + 0x110000


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


def prompt_ids(body: dict[str, Any], count: int) -> list[int]:
    """The ids of a request's ``count`` prompt tokens, as ``return_token_ids`` reports them:
    BOS and one id per character of a text prompt (so that they carry its content identity
    back), the ids of a token-id prompt as given, else (a chat) BOS and filler."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [BOS_ID, *[TEXT_ID_BASE + ord(c) for c in prompt]]
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        return list(prompt)
    return [BOS_ID] + [FILLER_ID] * (count - 1)


def ids_text(ids: list[Any]) -> tuple[str, int]:
    """The text a token-id prompt spells, as far as its ids are characters (a resumed leg's
    prompt: the original prompt, the generated tokens after it cut off), and the tokens before
    it (1 for a leading BOS, else 0)."""
    header = 1 if ids and ids[0] == BOS_ID else 0
    chars: list[str] = []
    for i in ids[header:]:
        if type(i) is not int or not TEXT_ID_BASE <= i < GENERATED_ID:
            break
        chars.append(chr(i - TEXT_ID_BASE))
    return "".join(chars), header


def chunk_writer(rid: str, model: str, chat: bool) -> wire.ChunkWriter:
    """The writer of request ``rid``'s stream (``rid``: the router's X-Request-Id)."""
    return wire.ChunkWriter(wire.completion_id(rid, chat), model, CREATED, chat=chat)


def token_chunk(
    writer: wire.ChunkWriter,
    n: int,
    final: bool,
    ids: bool = False,
    prompt: list[int] | None = None,
) -> bytes:
    """A streamed chunk of ``n`` tokens of filler text, the last of its stream if ``final`` (the
    simulator generates ``max_tokens``, so a stream ends for ``length``). ``ids``: the request
    asked for ``return_token_ids``: the chunk carries the generated tokens' ids
    (:data:`GENERATED_ID`) and, on the stream's first chunk, the prompt's ids ``prompt``
    (:func:`prompt_ids`)."""
    finish = "length" if final else None
    if not ids:
        return writer.token_chunk("x" * n, finish)
    return writer.token_chunk("x" * n, finish, [GENERATED_ID] * n, prompt)


def prefill_reply(
    rid: str,
    model: str,
    prompt: int,
    block_ids: list[int],
    engine_id: str,
    remote_request_id: str,
    host: str,
    port: int,
    cached: int | None = None,
) -> bytes:
    """A producer's answer to a prefill leg: a one-token completion whose
    ``kv_transfer_params`` tell the consumer where to pull the KV of ``block_ids``. ``cached``:
    the prompt tokens found in the producer's prefix cache, reported in
    ``usage.prompt_tokens_details.cached_tokens`` and ``remote_prefill_cached_tokens`` (None:
    prefix caching off, no details)."""
    return wire.prefill_reply(
        wire.completion_id(rid, False),
        model,
        CREATED,
        prompt_tokens=prompt,
        block_ids=block_ids,
        engine_id=engine_id,
        request_id=remote_request_id,
        host=host,
        port=port,
        cached_tokens=cached,
    )


def version_body() -> bytes:
    return wire.to_json({"version": ENGINE_VERSION})


def models_body(model: str) -> bytes:
    return wire.to_json({"object": "list", "data": [{"id": model, "object": "model"}]})
