"""Token ids for text and chat prompts, asked of an engine's ``/tokenize`` before placement, so
that ``kv_aware`` can score prompts that carry none.

Rule kept here: opt-in (``[routing.kv_aware] tokenize``), bounded and never blamed. The call is
made only for a request a ``kv_aware`` phase will place and whose body gives no token ids; it
is bounded by ``tokenize_timeout_s`` (and by the request's deadline); whatever goes wrong (no
ready engine, refused, reset, timed out, a 4xx or 5xx, an answer that is not a list of token
ids) leaves the request without ids, placed on load alone, as without this module. Nothing here
tells the breaker: tokenizing is not the inference path the breaker judges (as for the
``/tokenize`` pass-through, :mod:`narwhal.core.passthrough`), and an engine slow to tokenize
while it prefills is not broken. Each outcome is counted (:attr:`PromptTokens.counts`,
``/status``).

Theory of operation: :meth:`PromptTokens.fetch` builds the ``/tokenize`` body from the
request's (a completions ``prompt`` string, or a chat's ``messages`` with the keys that change
how vLLM renders them), asks the next ready engine (:meth:`PassThrough.engine`: any engine has
the tokenizer) through ``Transport.call`` with the deadline, and on a whole answer sets
``request.token_ids``, which the block identity
(:func:`narwhal.core.routing.block_identity.token_id_chain`) reads when the body has no ids.
The ids are the ones the engine will compute for the prompt (vLLM's ``/tokenize`` applies the
same tokenizer, special tokens and chat template as its inference routes), so the chain names
the blocks the engine will cache. The cost is one more engine round trip before placement for
every such request: it adds to the request's time to first token.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.jsonparse import parse_json
from narwhal.core.passthrough import TOKENIZE, PassThrough
from narwhal.core.policies import Policies
from narwhal.core.ports import Ports, Reply, TimedOut
from narwhal.core.requests import ClientRequest
from narwhal.core.routing.block_identity import prompt_token_ids
from narwhal.core.routing.kv_aware import kv_aware_phases

CHAT_KEYS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
)
"""Keys of a chat request that change how vLLM renders its messages, passed along."""

OUTCOMES = ("tokenized", "no_engine", "timed_out", "failed")


def tokenize_body(request: ClientRequest) -> dict[str, Any] | None:
    """The ``/tokenize`` body for ``request``'s prompt (None: a prompt it cannot express, e.g.
    several prompts, or one already given as token ids)."""
    body = request.body
    out: dict[str, Any] = {}
    if isinstance(body.get("model"), str):
        out["model"] = body["model"]
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        out["messages"] = messages
        out.update({key: body[key] for key in CHAT_KEYS if key in body})
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        return None
    out["prompt"] = prompt
    if "add_special_tokens" in body:
        out["add_special_tokens"] = body["add_special_tokens"]
    return out


def token_ids_of(reply: Reply) -> list[int] | None:
    """The token ids of a ``/tokenize`` answer (None: not a 200 with a non-empty list of
    non-negative ints as ``tokens``)."""
    if reply.status != 200:
        return None
    try:
        answer = parse_json(reply.body)
    except ValueError:
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not tokens:
        return None
    for token in tokens:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            return None
    return tokens


class PromptTokens:
    """Asks engines to tokenize text and chat prompts for ``kv_aware`` (module docstring)."""

    def __init__(self, passthrough: PassThrough) -> None:
        self._passthrough = passthrough  # whose turn picks the engine asked
        self.counts = dict.fromkeys(OUTCOMES, 0)

    @staticmethod
    def wanted(request: ClientRequest, policies: Policies) -> bool:
        """Whether ``request`` is one to tokenize (the option on, a ``kv_aware`` phase, no
        token ids in its body)."""
        routing = policies.config.routing
        return (
            routing.kv_aware.tokenize
            and bool(kv_aware_phases(routing))
            and prompt_token_ids(request.body) is None
        )

    async def fetch(self, request: ClientRequest, ports: Ports, policies: Policies) -> None:
        """Set ``request.token_ids`` from an engine's ``/tokenize`` when it can be had in time;
        otherwise leave them None (counted, never charged)."""
        if not self.wanted(request, policies):
            return
        body = tokenize_body(request)
        if body is None:
            return
        now = ports.clock.now()
        url = self._passthrough.engine(policies, now)
        if url is None:
            self.counts["no_engine"] += 1
            return
        config = policies.config
        deadline = min(
            now + config.routing.kv_aware.tokenize_timeout_s,
            request.arrival + config.engine.request_timeout_s,
        )
        reply = await ports.transport.call(url, "POST", TOKENIZE, body, {}, deadline)
        if isinstance(reply, TimedOut):
            self.counts["timed_out"] += 1
            return
        ids = token_ids_of(reply) if isinstance(reply, Reply) else None
        if ids is None:
            self.counts["failed"] += 1
            return
        request.token_ids = ids
        self.counts["tokenized"] += 1
