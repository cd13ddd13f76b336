"""Prompt content in the simulator: what a prompt is made of, written as text and read back.

This module names a simulated prompt's blocks; it caches nothing (the cache is the shared model
of vLLM's block pool, :mod:`narwhal.engines.block_pool`, which the HTTP emulator keys by hashing
its prompts' text instead).

Rule kept here: a simulated prompt's *content identity* is written in its text and read back
from the text alone, so the router (which hashes the rendered prompt) and the simulated engines
(which cache KV blocks by content) see the same sharing; and the simulated tokenizer still reads
one token per character after a fixed header (BOS, or a chat template's tokens).

Theory of operation:
- A prompt with an identity is a run of *segments* (:func:`prompt_text`): ``#<id in hex>;``
  then filler ``x`` up to the segment's length in tokens (the first segment's length counts the
  header). Segment ids are chained: an id names everything from the prompt's start to the end of
  its segment (the workload guarantees it), as a Mooncake trace's ``hash_ids`` do.
- So a full KV block is identified by the segment holding its last token and that token's offset
  in the segment: its :data:`BlockKey` is ``id * 2**32 + offset`` (:func:`block_keys`; one int,
  so a segment's keys are one ``range``). Two prompts' keys agree block for block exactly as far
  as their segments do, as vLLM's chained block hashes agree as far as the tokens do; reading
  them costs one split of the text, where hashing the text would cost a hash per block.
- A prompt given as token ids (a resumed stream's leg: the original prompt's ids, then the
  generated tokens', :mod:`narwhal.sim.gpu.wire`) is read back as the text its ids spell, up to
  the first generated token (:func:`content_keys`): its blocks hit the original prompt's,
  as vLLM's block hashes over the same ids do, and the blocks holding generated tokens are
  content no other prompt shares.
- A prompt whose text does not start with ``#`` has no identity: content no other prompt shares
  (the Azure traces and synthetic lengths record none). Its text starts with ``~<request
  number>;``, unique to the router too, and its blocks are never cached (not even for its own
  recompute after a preemption). A segment whose marker is cut short (a segment shorter than its
  marker) ends the identity there: the blocks from it on are content no other prompt shares.
"""

from __future__ import annotations

from typing import Any

from narwhal.engines.block_pool import BlockKey
from narwhal.sim.gpu.wire import ids_text

# a BlockKey here: chained segment id * OFFSETS + offset of the block's last token in the segment
OFFSETS = 1 << 32  # more tokens than any segment has
Segments = tuple[tuple[int, int], ...]  # (chained segment id, tokens), from the prompt's start

SEGMENT = "#"  # starts a segment's marker; a prompt with an identity starts with it
UNIQUE = "~"  # starts the marker of a prompt without an identity
END = ";"  # ends a marker
FILLER = "x"


def _marked(marker: str, chars: int) -> str:
    """``marker`` and filler up to ``chars`` characters (the marker cut short if it is longer)."""
    if chars <= len(marker):
        return marker[:chars]
    return marker + FILLER * (chars - len(marker))


def prompt_text(tokens: int, segments: Segments, number: int) -> str:
    """The completion text of a prompt of ``tokens`` tokens (BOS plus one per character) made
    of ``segments`` (their tokens sum to ``tokens``), or, without segments, unique to request
    ``number``."""
    if not segments:
        return _marked(f"{UNIQUE}{number:x}{END}", max(0, tokens - 1))
    parts: list[str] = []
    header = 1  # BOS: the first segment holds it
    for segment_id, length in segments:
        parts.append(_marked(f"{SEGMENT}{segment_id:x}{END}", length - header))
        header = 0
    return "".join(parts)


def content_text(body: dict[str, Any]) -> str | None:
    """The text a request's content identity is read from: a completion's prompt, or the
    content of a chat's only message (None for anything else: no identity)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) == 1 and isinstance(messages[0], dict):
        content = messages[0].get("content")
        if isinstance(content, str):
            return content
    return None


def content_keys(
    body: dict[str, Any], prompt_tokens: int, block_size: int
) -> list[BlockKey] | None:
    """The keys of the full blocks of a request's ``prompt_tokens``-token prompt (None: no
    content identity): of its text (:func:`content_text`), or of the text a token-id prompt
    spells before its first generated token."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        spelt, header = ids_text(prompt)
        return block_keys(spelt, header + len(spelt), block_size)
    text = content_text(body)
    return None if text is None else block_keys(text, prompt_tokens, block_size)


def block_keys(text: str, prompt_tokens: int, block_size: int) -> list[BlockKey] | None:
    """The keys of the full blocks of a prompt whose content is ``text`` after a header of
    ``prompt_tokens - len(text)`` tokens (it belongs to the first segment); None when the text
    has no identity. Blocks past the identified segments get no key."""
    if not text.startswith(SEGMENT):
        return None
    full = prompt_tokens // block_size * block_size  # tokens in full blocks
    keys: list[BlockKey] = []
    start = 0  # the first token of the current segment
    last = block_size - 1  # the last token of the next block to key
    end = prompt_tokens - len(text)  # the header: part of the first segment
    for part in text[1:].split(SEGMENT):
        marker_end = part.find(END)
        if marker_end <= 0:
            break
        try:
            segment_id = int(part[:marker_end], 16)
        except ValueError:
            break
        end += len(part) + 1
        stop = min(end, full)
        if last < stop:
            base = segment_id * OFFSETS - start  # key = base + the block's last token
            keys.extend(range(base + last, base + stop, block_size))
            last += (stop - last + block_size - 1) // block_size * block_size
        if last >= full:
            break
        start = end
    return keys
