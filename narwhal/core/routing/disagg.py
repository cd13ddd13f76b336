"""Per-request disaggregation: whether a prompt is prefilled on a producer or by its consumer.

Rule kept here: a request is prefilled by its consumer (the contract's same-worker path: the
decode leg carries no transfer parameters) only for a reason this module names — its estimated
uncached prompt is shorter than ``[routing] remote_prefill_min_tokens`` (``short_prompt``), or
no producer is placeable and ``[routing] no_producer = "local"`` (``no_producer``), or every
producer attempt it could make failed and ``[routing] prefill_fallback = "local"``
(``producer_failed``; decided by :func:`narwhal.core.retry.falls_back_locally`); every other
request is prefilled remotely, as by default (``remote_prefill_min_tokens = 0``,
``no_producer = "fail"``, ``prefill_fallback = "none"``), where nothing here changes a placement
or draws randomness.

Theory of operation: the router has no tokenizer. :func:`estimated_prompt_tokens` counts a
tokenized prompt's ids, and otherwise the bytes of the rendered prompt
(:func:`~narwhal.core.routing.prefix.rendered_prompt`: the completion text, or every chat turn
as JSON), the unit ``prefix_affinity``'s index counts in; a byte-level BPE token covers at least
one byte, so for text this overestimates the tokens, and only prompts that are surely short go
to their consumer. When the decode phase is placed by ``prefix_affinity``, what its index says
the consumer it would choose already holds (:meth:`PrefixAffinity.held_blocks`, no side
effects) is taken off, in proportion of the rendered prompt; when it is placed by ``kv_aware``,
the blocks the consumer it would choose holds by its own KV events, times the block size those
events report (:meth:`KvAware.held_tokens`); otherwise the whole prompt counts as uncached.
:class:`PrefillRoutes` counts the choices (``/status``, ``/metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.core.config import RoutingSettings
from narwhal.core.requests import COMPLETIONS, ClientRequest
from narwhal.core.routing.kv_aware import KvAware
from narwhal.core.routing.policy import RoutingPolicy
from narwhal.core.routing.prefix import PrefixAffinity, rendered_prompt

SHORT_PROMPT = "short_prompt"
NO_PRODUCER = "no_producer"
PRODUCER_FAILED = "producer_failed"


def _token_ids(request: ClientRequest) -> int | None:
    """The number of ids of a tokenized completion prompt (None: the prompt is text)."""
    if request.endpoint != COMPLETIONS:
        return None
    prompt = request.body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of one tokenized prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return None


def estimated_prompt_tokens(request: ClientRequest) -> int:
    """The prompt's length in tokens as the router estimates it (module docstring)."""
    ids = _token_ids(request)
    return ids if ids is not None else len(rendered_prompt(request))


@dataclass
class PrefillRoutes:
    """How many attempts were prefilled where, and why (reads, never decisions)."""

    remote: int = 0
    short_prompt: int = 0
    no_producer: int = 0
    producer_failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "remote": self.remote,
            SHORT_PROMPT: self.short_prompt,
            NO_PRODUCER: self.no_producer,
            PRODUCER_FAILED: self.producer_failed,
        }

    def count_local(self, reason: str) -> None:
        """One more attempt prefilled by its consumer, for ``reason``."""
        if reason == SHORT_PROMPT:
            self.short_prompt += 1
        elif reason == NO_PRODUCER:
            self.no_producer += 1
        else:
            self.producer_failed += 1


class Disaggregation:
    """The per-request choice between a remote and a local prefill (module docstring)."""

    def __init__(self, settings: RoutingSettings, decode_policy: RoutingPolicy) -> None:
        self.min_remote_tokens = settings.remote_prefill_min_tokens
        self.local_without_producer = settings.no_producer == "local"
        self.local_after_producer_failure = settings.prefill_fallback == "local"
        self._index = decode_policy if isinstance(decode_policy, PrefixAffinity) else None
        self._kv = decode_policy if isinstance(decode_policy, KvAware) else None
        self.routes = PrefillRoutes()

    def uncached_tokens(
        self, request: ClientRequest, consumers: list[str], now: float = 0.0
    ) -> int:
        """The estimated prompt tokens the consumer the decode policy would choose among
        ``consumers`` does not hold."""
        if self._kv is not None:  # what the consumer's own KV events say it holds
            tokens = estimated_prompt_tokens(request)
            return max(0, tokens - self._kv.held_tokens(consumers, request, now))
        index = self._index
        if index is None or not consumers:
            return estimated_prompt_tokens(request)
        rendered = len(rendered_prompt(request))
        ids = _token_ids(request)
        tokens = rendered if ids is None else ids
        held = min(rendered, index.held_blocks(consumers, request) * index.block_size)
        return tokens - tokens * held // rendered if rendered else tokens

    def short_prompt(self, request: ClientRequest, consumers: list[str], now: float = 0.0) -> bool:
        """Whether ``request``'s consumer should prefill it: its uncached prompt is below
        ``remote_prefill_min_tokens`` (never when that is 0)."""
        if self.min_remote_tokens == 0:
            return False
        return self.uncached_tokens(request, consumers, now) < self.min_remote_tokens
