"""The per-request record: what one client request did, shared by live and simulation.

Rule kept here: a record is an immutable value written once, when its request ends; durations
are seconds from the request's arrival at the router, on the clock the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestRecord:
    """What one client request did. Durations are seconds from arrival at the router."""

    request_id: str
    arrival: float
    status: int
    outcome: str  # "ok" or the FaultKind value that ended it, or "client_gone"
    committed: bool  # HTTP 200 was sent before the end (streaming)
    ttft_s: float | None  # producer HTTP leg completed (last attempt that got that far)
    # first generated decode output observed by the router (last attempt that got that far)
    first_byte_s: float | None
    finished_s: float  # end of the request
    attempts: int
    engines: tuple[str, ...]  # every engine used, in order (producer, consumer, ...)
    output_tokens: int  # generated-output events received (last attempt that decoded)
    error: str | None = None

    def __init__(
        self,
        request_id: str,
        arrival: float,
        status: int,
        outcome: str,
        committed: bool,
        ttft_s: float | None,
        first_byte_s: float | None,
        finished_s: float,
        attempts: int,
        engines: tuple[str, ...],
        output_tokens: int,
        error: str | None = None,
    ) -> None:
        # written out as the dataclass would: compiled, direct writes (see core.ports.Reply)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "arrival", arrival)
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "committed", committed)
        object.__setattr__(self, "ttft_s", ttft_s)
        object.__setattr__(self, "first_byte_s", first_byte_s)
        object.__setattr__(self, "finished_s", finished_s)
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "engines", engines)
        object.__setattr__(self, "output_tokens", output_tokens)
        object.__setattr__(self, "error", error)

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "arrival": self.arrival,
            "status": self.status,
            "outcome": self.outcome,
            "committed": self.committed,
            "ttft_s": self.ttft_s,
            "first_byte_s": self.first_byte_s,
            "finished_s": self.finished_s,
            "attempts": self.attempts,
            "engines": list(self.engines),
            "output_tokens": self.output_tokens,
            "error": self.error,
        }
