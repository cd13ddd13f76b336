"""``prefix_affinity``: send a prompt to the engine that has seen the longest prefix of it.

This is the router's index of what it *sent* where, an estimate kept without asking any engine;
it is not a model of an engine's prefix cache (that is :mod:`narwhal.engines.block_pool`, used by
the simulated engine and the emulator): an engine may have evicted what this index still holds,
and the index evicts by its own bound, not by the engine's free blocks.

Rule kept here: the index is approximate and bounded — per engine at most
``max_blocks_per_engine`` block hashes (8-byte digests in an ordered dict, about 130 bytes
each with their entry: about 4 MB per engine at the default 32,768), least recently used
evicted first — and it is pure: nothing here does I/O or reads a clock.

Theory of operation:
- The prompt is rendered to UTF-8 bytes whole (:func:`rendered_prompt`): a completion's prompt
  text (token ids as their JSON text); a chat's ``tools`` and *every* message, each as
  canonical JSON, one per line, so two conversations share a rendered prefix exactly as far as
  their turns agree. A byte stands for a token (the router has no tokenizer): ``block_size``
  bytes make one block, as vLLM hashes blocks of ``block_size`` tokens.
- Only full blocks are hashed, as a chain (:func:`block_hashes`): each block's hash covers the
  previous block's hash, so equal hashes mean equal prefixes, as in vLLM's prefix cache. A
  prompt's blocks past ``max_blocks_per_engine`` are not hashed: no engine's index could hold
  them.
- Placing a request records its chain in the chosen engine's :class:`PrefixIndex`, last block
  first, so a chain's first blocks are always more recently used than its later ones and LRU
  eviction takes a chain from its end. What an index holds of any chain is therefore a prefix
  of it, which lets :meth:`PrefixIndex.match` find the longest matched prefix by bisection.
- Choosing: the candidate whose index matches the most leading blocks wins, ties broken by
  ``least_reserved`` among the tied. No match (or no full block, or no request) is
  ``least_reserved`` over all candidates. The load guard: when the engine the match picks
  holds more than ``imbalance_threshold`` reservations of the phase above the least reserved
  candidate, the match is overridden and the choice is ``least_reserved`` over all.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from typing import Any

from narwhal.core.config import PrefixAffinitySettings
from narwhal.core.requests import CHAT, COMPLETIONS, ClientRequest
from narwhal.core.routing.policy import Counts, RoutingPolicy, least_reserved

_DIGEST_BYTES = 8


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def rendered_prompt(request: ClientRequest) -> bytes:
    """The whole prompt of ``request`` as bytes, the same for the same prompt (module doc)."""
    body = request.body
    if request.endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one prompt is that prompt
        text = prompt if isinstance(prompt, str) else _canonical(prompt)
        return text.encode("utf-8", "surrogatepass")
    if request.endpoint == CHAT:
        turns = [_canonical(message) for message in body.get("messages") or ()]
        if body.get("tools"):  # the chat template renders the tools ahead of the turns
            turns.insert(0, _canonical(body["tools"]))
        return "\n".join(turns).encode("utf-8", "surrogatepass")
    return b""


def block_hashes(data: bytes, block_size: int, limit: int) -> list[bytes]:
    """The chained hashes of the first (at most ``limit``) full ``block_size`` blocks."""
    # (the hash of the previous digest followed by the block, fed in two updates rather than as
    # one concatenated bytes: compiled by mypyc, ``bytes + bytes`` leaks its result)
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, min(len(data) // block_size, limit) * block_size, block_size):
        hasher = hashlib.blake2b(previous, digest_size=_DIGEST_BYTES)
        hasher.update(data[start : start + block_size])
        previous = hasher.digest()
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """The block hashes one engine has been sent, at most ``capacity``, LRU evicted."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: bytes) -> bool:
        return block in self._blocks

    def match(self, chain: list[bytes]) -> int:
        """How many leading blocks of ``chain`` this engine holds."""
        # bisection: what the index holds of a chain is a prefix of it (module docstring)
        blocks = self._blocks
        held, beyond = 0, len(chain)  # chain[:held] is held; chain[beyond:] is not
        while held < beyond:
            middle = (held + beyond + 1) // 2
            if chain[middle - 1] in blocks:
                held = middle
            else:
                beyond = middle - 1
        return held

    def record(self, chain: list[bytes]) -> None:
        """The engine was sent ``chain``: its blocks become the most recently used, its first
        block most of all; the least recently used go beyond ``capacity``."""
        blocks = self._blocks
        for block in reversed(chain):
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = None
                if len(blocks) > self.capacity:
                    blocks.popitem(last=False)


class PrefixAffinity(RoutingPolicy):
    """The longest matched prefix wins, within the load guard (module docstring)."""

    name = "prefix_affinity"

    def __init__(
        self,
        phase: str,
        counts: Counts,
        rng: random.Random,
        serving: list[str],
        settings: PrefixAffinitySettings,
    ) -> None:
        super().__init__(phase, counts, rng)
        self.block_size = settings.block_size
        self._limit = settings.max_blocks_per_engine
        self._threshold = settings.imbalance_threshold
        self.indexes = {url: PrefixIndex(settings.max_blocks_per_engine) for url in serving}
        self._memo: tuple[ClientRequest, list[bytes]] | None = None  # the last chain made
        # placements sent to an engine for its match / whose match the load guard overrode /
        # with no candidate matching
        self.hits = 0
        self.overrides = 0
        self.misses = 0

    def chain(self, request: ClientRequest | None) -> list[bytes]:
        if request is None:
            return []
        memo = self._memo
        if memo is not None and memo[0] is request:  # asked twice for one request
            return memo[1]
        chain = block_hashes(rendered_prompt(request), self.block_size, self._limit)
        self._memo = (request, chain)
        return chain

    def _longest_match(self, candidates: list[str], chain: list[bytes]) -> tuple[int, list[str]]:
        """The longest prefix of ``chain`` any candidate's index holds, and the candidates
        holding that much (none when nobody holds a block)."""
        longest = 0
        tied: list[str] = []
        for url in candidates:
            matched = self.indexes[url].match(chain)
            if matched > longest:
                longest, tied = matched, [url]
            elif matched == longest and matched:
                tied.append(url)
        return longest, tied

    def held_blocks(self, candidates: list[str], request: ClientRequest) -> int:
        """How many leading blocks of ``request``'s prompt the index says the engine
        :meth:`choose` would pick among ``candidates`` holds (0 when the load guard would
        override the match). Changes nothing and draws no randomness: every engine tied for
        the longest match holds as many blocks, and the guard looks only at reservations."""
        chain = self.chain(request)
        if not chain or not candidates:
            return 0
        longest, tied = self._longest_match(candidates, chain)
        if not tied:
            return 0
        counts, phase = self._counts, self.phase
        fewest_tied = min(counts[url][phase] for url in tied)
        fewest = min(counts[url][phase] for url in candidates)
        return 0 if fewest_tied - fewest > self._threshold else longest

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        chain = self.chain(request)
        chosen = self._by_match(candidates, chain)
        self.indexes[chosen].record(chain)
        return chosen

    def _by_match(self, candidates: list[str], chain: list[bytes]) -> str:
        counts, phase, rng = self._counts, self.phase, self._rng
        tied = self._longest_match(candidates, chain)[1] if chain else []
        if not tied:
            self.misses += 1
            return least_reserved(candidates, counts, phase, rng)
        chosen = least_reserved(tied, counts, phase, rng)
        fewest = min(counts[url][phase] for url in candidates)
        if counts[chosen][phase] - fewest > self._threshold:
            self.overrides += 1
            return least_reserved(candidates, counts, phase, rng)
        self.hits += 1
        return chosen

    def placed(self, url: str, request: ClientRequest | None, now: float) -> None:
        self.indexes[url].record(self.chain(request))

    def serving_changed(self, serving: list[str]) -> None:
        """An index per serving engine: a new engine starts empty, a removed one's is dropped."""
        held = self.indexes
        self.indexes = {
            url: held[url] if url in held else PrefixIndex(self._limit) for url in serving
        }
