"""Fault taxonomy: what went wrong, which status the client sees, and who is charged.

Rule kept here: the mapping from a fault to a client status, a charge against an engine and a
retry decision is written once, in :data:`FAULT_RULES`; nothing else in Narwhal chooses a status.

Theory of operation: the lifecycle observes a transport result or an SSE event and builds a
:class:`Fault` with :func:`fault`. Timeout-shaped faults map to 504, other engine faults to 502,
an in-band error object to its own status, an engine 4xx is passed through untouched (never
retried, never charged). The texts the contract fixes are module constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from narwhal.core import wire

DONE_BEFORE_TOKEN_TEXT = "stream ended with [DONE] before any token arrived"
SILENCE_TEXT = "engine went silent between tokens"


class FaultKind(Enum):
    REFUSED = "refused"  # connection refused / could not connect
    RESET = "reset"  # connection reset or dropped before a full response
    ENGINE_5XX = "engine_5xx"  # HTTP 5xx from an engine before streaming
    ENGINE_4XX = "engine_4xx"  # HTTP 4xx from an engine: the request's fault, passed through
    MALFORMED_RESPONSE = "malformed_response"  # prefill body not the expected JSON, bad SSE data
    BAD_DESCRIPTOR = "bad_descriptor"  # the producer's KV descriptor failed validation
    HANDOFF_TOO_OLD = "handoff_too_old"  # the handoff aged past engine.max_handoff_age_s
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"
    SILENCE = "silence"  # no chunk within engine.decode_read_timeout_s after the first token
    CLOSED_BEFORE_DONE = "closed_before_done"
    DONE_BEFORE_TOKEN = "done_before_token"
    INBAND_ERROR = "inband_error"  # an error object inside an HTTP 200 stream
    DEADLINE = "deadline"  # the original request deadline passed
    NO_ENGINE = "no_engine"  # no engine of a role is eligible (503 + Retry-After)
    OVERLOADED = "overloaded"  # the router's own bound on requests in flight (503 + Retry-After)
    SHED = "shed"  # flow control refused or dropped a queued request (503 + Retry-After)
    MODEL_NOT_FOUND = "model_not_found"  # a model the pinned contract does not serve (404)


@dataclass(frozen=True)
class FaultRule:
    status: int | None  # None: the status comes from the engine / error object
    charged: bool  # counts against the engine (breaker streak, quarantine)
    retryable: bool  # a fresh attempt may be made before visible output
    error_type: str


FAULT_RULES: dict[FaultKind, FaultRule] = {
    FaultKind.REFUSED: FaultRule(502, True, True, "engine_unreachable"),
    FaultKind.RESET: FaultRule(502, True, True, "engine_connection_reset"),
    FaultKind.ENGINE_5XX: FaultRule(502, True, True, "engine_error"),
    FaultKind.ENGINE_4XX: FaultRule(None, False, False, "invalid_request_error"),
    FaultKind.MALFORMED_RESPONSE: FaultRule(502, True, True, "engine_malformed_response"),
    FaultKind.BAD_DESCRIPTOR: FaultRule(502, True, True, "engine_bad_kv_descriptor"),
    FaultKind.HANDOFF_TOO_OLD: FaultRule(504, True, True, "handoff_too_old"),
    FaultKind.FIRST_TOKEN_TIMEOUT: FaultRule(504, True, True, "engine_timeout"),
    FaultKind.SILENCE: FaultRule(504, True, True, "engine_timeout"),
    FaultKind.CLOSED_BEFORE_DONE: FaultRule(502, True, True, "engine_stream_closed"),
    # not charged here: a healthy engine sends it for a legitimately empty completion (an
    # immediate end of sequence or stop string), which must not eject it; charged later only if
    # another engine answers the same request with a token (narwhal.core.empty_streams)
    FaultKind.DONE_BEFORE_TOKEN: FaultRule(502, False, True, "engine_empty_stream"),
    FaultKind.INBAND_ERROR: FaultRule(None, True, True, "engine_error"),
    FaultKind.DEADLINE: FaultRule(504, False, False, "request_timeout"),
    FaultKind.NO_ENGINE: FaultRule(503, False, False, "no_engine_available"),
    FaultKind.OVERLOADED: FaultRule(503, False, False, "router_overloaded"),
    FaultKind.SHED: FaultRule(503, False, False, "router_shed"),
    # vLLM's own answer to a model it does not serve (type and param as vLLM writes them)
    FaultKind.MODEL_NOT_FOUND: FaultRule(404, False, False, "NotFoundError"),
}


@dataclass(frozen=True)
class Fault:
    """One observed failure of one attempt."""

    kind: FaultKind
    status: int
    message: str
    engine: str | None  # the engine charged (None: nobody)
    phase: str  # "prefill" | "decode" | "placement" | "request"
    retryable: bool
    error_type: str
    upstream_body: dict[str, Any] | None = None  # an engine 4xx body, passed through as is
    param: str | None = None  # the request field at fault (the error object's ``param``)

    def error_body(self) -> dict[str, Any]:
        """The OpenAI-shaped error object sent to the client."""
        if self.upstream_body is not None:
            return self.upstream_body
        return wire.error_object(self.status, self.message, self.error_type, param=self.param)


def fault(
    kind: FaultKind,
    message: str,
    *,
    engine: str | None,
    phase: str,
    status: int | None = None,
    upstream_body: dict[str, Any] | None = None,
    param: str | None = None,
) -> Fault:
    """Build a :class:`Fault`, applying :data:`FAULT_RULES`.

    ``status`` is required for ENGINE_4XX and INBAND_ERROR (the engine's / error object's own).
    An in-band 4xx is the request's fault: passed through, neither charged nor retried.
    """
    rule = FAULT_RULES[kind]
    resolved = rule.status if rule.status is not None else status
    if resolved is None:
        raise ValueError(f"{kind.value} needs the upstream status")
    charged, retryable = rule.charged, rule.retryable
    if kind is FaultKind.INBAND_ERROR and resolved < 500:
        charged, retryable = False, False
    return Fault(
        kind=kind,
        status=resolved,
        message=message,
        engine=engine if charged else None,
        phase=phase,
        retryable=retryable,
        error_type=rule.error_type,
        upstream_body=upstream_body,
        param=param,
    )
