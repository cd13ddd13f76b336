"""Records: the decision log and the per-request record, shared by live and simulation.

Rule kept here: records are immutable values appended in the order decisions are made; nothing
reads the clock here, callers pass ``now``. The decision log is what the parity test compares
between the simulator and the live router.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Decision:
    """One policy decision: a placement, an ejection, a readmission, a client status..."""

    t: float
    kind: str  # place | eject | readmit | probe | quarantine | retry | status | stale
    engine: str | None = None
    detail: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "engine": self.engine, **dict(self.detail)}


@dataclass
class DecisionLog:
    """An append-only list of :class:`Decision`; ``enabled=False`` keeps nothing (hot paths)."""

    enabled: bool = True
    entries: list[Decision] = field(default_factory=list)

    def add(self, t: float, kind: str, engine: str | None = None, **detail: Any) -> None:
        if self.enabled:
            self.entries.append(Decision(t, kind, engine, tuple(sorted(detail.items()))))


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
