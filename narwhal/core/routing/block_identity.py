"""Block identity: the hashes vLLM 0.32 gives a prompt's KV blocks, computed from token ids.

Rule kept here: the router names a prompt's blocks exactly as the pinned vLLM (0.32.0) names
them in its KV cache events, or not at all. A hash the router computes here equals the hash the
engine reports for the same tokens only under the conditions below; where they do not hold the
router has no block identity (None), and ``kv_aware`` places on load alone rather than on a
guess. Pure: no I/O, no clock, no randomness.

The algorithm (vLLM's documented prefix-caching scheme, ``--prefix-caching-hash-algo``):
- A prompt's token ids are cut into full blocks of ``block_size`` tokens (a partial last block
  has no hash). Block ``i``'s hash is ``H((parent, tokens_i, extra_keys_i))``: ``parent`` is
  block ``i-1``'s hash, or for the first block the seed hash ``NONE = H(seed)``; ``tokens_i`` is
  a tuple of the block's ids; ``extra_keys_i`` is None or a tuple of tagged keys.
- ``H`` by algorithm: ``sha256`` (vLLM's default) is SHA-256 of the object's pickle at the
  highest protocol (5); ``sha256_cbor`` is SHA-256 of its canonical CBOR encoding (a tuple is
  an array, bytes a byte string, an int the shortest integer, None the simple value null, a str
  a text string).
- The seed: the engine's ``PYTHONHASHSEED`` when it is set, else the fixed string
  ``"vllm-none-hash"`` for both SHA-256 algorithms. The ``xxhash`` algorithms draw a random
  seed per process unless ``PYTHONHASHSEED`` is set, and need the third-party xxhash package:
  they are not reproducible here and are refused (configure ``sha256`` or ``sha256_cbor``).
- What the events carry: by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) each hash as an
  int, the digest's last 8 bytes read big-endian (``int.from_bytes(digest) mod 2**64``); with
  the variable 0 the 32-byte digest itself (``int_hashes = False`` here).
- Extra keys: a request with a ``cache_salt`` has ``(("cache_salt", salt),)`` as its first
  block's extra keys. LoRA adapters, multimodal inputs and prompt embeddings add keys the router
  cannot know from the request body alone: such requests have no identity here (None).

What is and is not reproducible: every full block of a prompt whose token ids the router holds,
on engines of one block size (the configured one; hybrid models whose attention groups hash at
another granularity are out of scope), with the configured algorithm and seed, is reproduced
bit for bit (checked against vLLM's own hasher in tests/vllm). A prompt given as text has no
token ids before it is placed (the router has no tokenizer): it has no identity here.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

from narwhal.core.requests import ClientRequest
from narwhal.core.routing.kv_events import BlockHash

DEFAULT_SEED = "vllm-none-hash"
ALGORITHMS = ("sha256", "sha256_cbor")
_MASK64 = (1 << 64) - 1


def _cbor_head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    if value < 1 << 8:
        return bytes([major << 5 | 24, value])
    if value < 1 << 16:
        return bytes([major << 5 | 25]) + struct.pack(">H", value)
    if value < 1 << 32:
        return bytes([major << 5 | 26]) + struct.pack(">I", value)
    if value < 1 << 64:
        return bytes([major << 5 | 27]) + struct.pack(">Q", value)
    raise ValueError(f"an integer outside CBOR's 64-bit range: {value}")


def canonical_cbor(value: Any) -> bytes:
    """``value`` (None, bool, int, bytes, str, tuple or list of them) as canonical CBOR."""
    if value is None:
        return b"\xf6"
    if value is True:
        return b"\xf5"
    if value is False:
        return b"\xf4"
    if isinstance(value, int):
        return _cbor_head(0, value) if value >= 0 else _cbor_head(1, -1 - value)
    if isinstance(value, bytes):
        return _cbor_head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return _cbor_head(3, len(data)) + data
    if isinstance(value, tuple | list):
        return _cbor_head(4, len(value)) + b"".join(canonical_cbor(item) for item in value)
    raise TypeError(f"no canonical CBOR here for {type(value).__name__}")


def _digest(algo: str, value: Any) -> bytes:
    if algo == "sha256":
        return hashlib.sha256(pickle.dumps(value, protocol=5)).digest()
    return hashlib.sha256(canonical_cbor(value)).digest()


class VllmBlockHasher:
    """A prompt's block hashes as vLLM 0.32 reports them (module docstring)."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        algo: str = "sha256",
        seed: str | None = None,
        int_hashes: bool = True,
    ) -> None:
        if algo not in ALGORITHMS:
            raise ValueError(
                f"prefix-caching hash algorithm {algo!r} is not reproducible by the router "
                f"(xxhash seeds are random per engine process); use one of {ALGORITHMS}"
            )
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.algo = algo
        self.int_hashes = int_hashes
        self.none_hash = _digest(algo, DEFAULT_SEED if seed is None else seed)

    def digests(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[bytes]:
        """The full blocks' digests, in prompt order."""
        size, algo = self.block_size, self.algo
        parent = self.none_hash
        out: list[bytes] = []
        for start in range(0, len(token_ids) // size * size, size):
            extra = (("cache_salt", cache_salt),) if start == 0 and cache_salt else None
            parent = _digest(algo, (parent, tuple(token_ids[start : start + size]), extra))
            out.append(parent)
        return out

    def chain(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[BlockHash]:
        """The full blocks' hashes as the engine's KV events carry them."""
        digests = self.digests(token_ids, cache_salt)
        if not self.int_hashes:
            return list(digests)
        return [int.from_bytes(d, "big") & _MASK64 for d in digests]


def prompt_token_ids(body: dict[str, Any]) -> list[int] | None:
    """The token ids a completions body gives as its prompt (a list of ints, or a batch of one
    such list), or None (text, chat messages, or several prompts)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    return None


def token_id_chain(hasher: VllmBlockHasher) -> Callable[[ClientRequest], list[BlockHash] | None]:
    """The live router's block identity: a request's chain from the token ids it carries (or,
    for a text or chat prompt, those an engine's ``/tokenize`` gave:
    :mod:`narwhal.core.routing.prompt_tokens`), its ``cache_salt`` included; None for a request
    without token ids, or with a ``cache_salt`` that is not a string (module docstring: what is
    not reproducible)."""

    def chain_of(request: ClientRequest) -> list[BlockHash] | None:
        ids = prompt_token_ids(request.body)
        if ids is None:
            ids = request.token_ids  # a text or chat prompt an engine tokenized for us
        if ids is None:
            return None
        salt = request.body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            return None
        return hasher.chain(ids, salt or None)

    return chain_of
