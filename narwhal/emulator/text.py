"""Deterministic prompts and generations of the emulator.

Rule kept here: the text an emulated engine generates is a pure function of the prompt and the
number of tokens, so tests can assert the exact tokens a client must receive
(:func:`completion_tokens`), and a producer and a consumer agree on the same prompt.

Theory of operation: a chat request is rendered with a ChatML-like template, a completions
prompt is taken as is; like the tiny model the real-vLLM tests serve
(:mod:`narwhal.vllm.tiny_model`), one character is one token and a prompt counts its characters
plus one (BOS). Generation is autoregressive, as a model's greedy decoding is: each token is a
lowercase letter picked from the SHA-256 digest of everything before it (the prompt and the
tokens generated so far), so the continuation of a prompt followed by its first ``k`` generated
tokens is exactly the rest of that prompt's generation (a resumed stream's exact continuity is
checked against it). A prompt given as token ids is the text of those ids, its leading BOS
dropped (the BOS is counted, not rendered). Token ids (``/tokenize``, ``/detokenize``) follow
the tiny model's layout: the special tokens first (``<s>``, the BOS, is id 1), then one id per
character (:func:`token_ids`, :func:`detokenized`).
"""

from __future__ import annotations

import hashlib
from typing import Any

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in value if isinstance(part, dict))
    return "" if value is None else str(value)


def prompt_text(body: dict[str, Any], chat: bool) -> str:
    """The prompt an engine would tokenize for this request body."""
    if chat:
        rendered = [
            f"<|im_start|>{m.get('role', 'user')}\n{_content(m.get('content'))}<|im_end|>\n"
            for m in body.get("messages", [])
            if isinstance(m, dict)
        ]
        return "".join(rendered) + "<|im_start|>assistant\n"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        ids = prompt[1:] if prompt[0] == BOS_ID else prompt
        return detokenized(ids)
    if isinstance(prompt, list):
        return "".join(p if isinstance(p, str) else str(p) for p in prompt)
    return _content(prompt)


def prompt_tokens(text: str) -> int:
    """Characters plus one (the BOS token)."""
    return len(text) + 1


def digest(text: str) -> str:
    """A short fingerprint of the prompt, stored with its KV blocks."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def completion_tokens(text: str, count: int) -> list[str]:
    """The ``count`` tokens an emulated engine generates for prompt ``text``: each a function of
    the prompt and every token before it (one running digest, so the work is linear)."""
    context = hashlib.sha256(text.encode())
    out = []
    for _ in range(count):
        token = ALPHABET[context.copy().digest()[0] % len(ALPHABET)]
        context.update(token.encode())
        out.append(token)
    return out


def completion_text(body: dict[str, Any], chat: bool, max_tokens: int) -> str:
    """The whole text generated for a request body (what a client must receive)."""
    return "".join(completion_tokens(prompt_text(body, chat), max_tokens))


SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
BOS_ID = SPECIAL_TOKENS.index("<s>")
MAX_TOKEN_ID = len(SPECIAL_TOKENS) + 0x10FFFF  # the last character's id


def token_ids(text: str, bos: bool = True) -> list[int]:
    """The ids of ``text``'s tokens: the BOS (unless ``bos`` is False), then one per character;
    with the BOS, as many as :func:`prompt_tokens` counts."""
    ids = [len(SPECIAL_TOKENS) + ord(c) for c in text]
    return [BOS_ID, *ids] if bos else ids


def detokenized(ids: list[int]) -> str:
    """The text of token ``ids`` (special tokens written as themselves, as a tokenizer's
    ``decode`` does by default); ``ValueError`` names an id outside the vocabulary."""
    pieces = []
    for token in ids:
        if token < 0 or token > MAX_TOKEN_ID or 0xD800 <= token - len(SPECIAL_TOKENS) < 0xE000:
            raise ValueError(f"token id {token} is out of vocabulary")
        special = token < len(SPECIAL_TOKENS)
        pieces.append(SPECIAL_TOKENS[token] if special else chr(token - len(SPECIAL_TOKENS)))
    return "".join(pieces)
