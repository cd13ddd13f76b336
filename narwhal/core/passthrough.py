"""Requests passed to one engine as they are: vLLM's ``/tokenize`` and ``/detokenize``.

Rule kept here: a pass-through request is answered by one ready engine (one the breaker lets
serve now), taken in turn; what it says is returned as it said it when it is a JSON object with
a status below 500 (a 400 for a bad body is the client's, passed through). Anything else is the
router's gateway answer in OpenAI's shape: 502 for an engine refused, reset, 5xx or not JSON,
504 when it did not answer within ``engine.first_token_timeout_s``, 503 with ``Retry-After``
when no engine is ready. None of them is charged to the engine: tokenizing is not the inference
path the breaker judges, and an engine busy prefilling may be slow at it without being broken.
A model the pinned contract does not serve is refused first (:mod:`narwhal.core.served_model`).

Theory of operation: :class:`PassThrough` (one per router) keeps the turn; :meth:`PassThrough.
serve` makes the decision and the one port call (``Transport.call``, the body as parsed, a
deadline) and returns the status, the JSON body and the headers for the driver to write.
"""

from __future__ import annotations

from typing import Any

from narwhal.core.errors import Fault, FaultKind, fault
from narwhal.core.jsonparse import parse_json
from narwhal.core.policies import Policies
from narwhal.core.ports import ConnectFailed, Ports, Reply, TimedOut
from narwhal.core.served_model import unserved_model

TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
PASSTHROUGH_PATHS = (TOKENIZE, DETOKENIZE)

Answer = tuple[int, dict[str, Any], dict[str, str]]
"""Status, JSON body and headers of a pass-through answer."""


def _refused(failure: Fault, headers: dict[str, str] | None = None) -> Answer:
    return failure.status, failure.error_body(), headers or {}


class PassThrough:
    """Passes ``/tokenize`` and ``/detokenize`` to the ready engines in turn."""

    def __init__(self) -> None:
        self._turn = 0

    def engine(self, policies: Policies, now: float) -> str | None:
        """The next ready engine (any role: every engine has the tokenizer), or None."""
        placement = policies.placement
        ready = set(placement.candidates("prefill", now))
        ready.update(placement.candidates("decode", now))
        urls = [entry.url for entry in policies.config.engines if entry.url in ready]
        if not urls:
            return None
        self._turn += 1
        return urls[self._turn % len(urls)]

    async def serve(
        self, path: str, body: dict[str, Any], ports: Ports, policies: Policies
    ) -> Answer:
        """Answer one pass-through request (``path`` one of :data:`PASSTHROUGH_PATHS`)."""
        unserved = unserved_model(body, policies.config)
        if unserved is not None:
            return _refused(unserved)
        now = ports.clock.now()
        url = self.engine(policies, now)
        if url is None:
            retry_after = max(1, round(policies.config.recovery.probe_interval_s))
            failure = fault(
                FaultKind.NO_ENGINE, "no engine is ready", engine=None, phase="placement"
            )
            return _refused(failure, {"retry-after": str(retry_after)})
        timeout_s = policies.config.engine.first_token_timeout_s
        reply = await ports.transport.call(url, "POST", path, body, {}, now + timeout_s)
        where = f"engine {url} {path}"
        if isinstance(reply, TimedOut):
            message = f"{where}: no answer within engine.first_token_timeout_s ({timeout_s:g} s)"
            return _refused(fault(FaultKind.DEADLINE, message, engine=None, phase="request"))
        if isinstance(reply, ConnectFailed):
            kind = FaultKind.REFUSED if reply.reason == "refused" else FaultKind.RESET
            return _refused(fault(kind, f"{where}: {reply.reason}", engine=url, phase="request"))
        return _engine_answer(reply, url, where)


def _engine_answer(reply: Reply, url: str, where: str) -> Answer:
    """The engine's own answer, or a 502 when it is a 5xx or not a JSON object."""
    if reply.status >= 500 or reply.status < 200:
        message = f"{where}: HTTP {reply.status}"
        return _refused(fault(FaultKind.ENGINE_5XX, message, engine=url, phase="request"))
    try:
        answer = parse_json(reply.body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        message = f"{where}: HTTP {reply.status} with a body that is not a JSON object"
        return _refused(fault(FaultKind.MALFORMED_RESPONSE, message, engine=url, phase="request"))
    return reply.status, answer, {}
