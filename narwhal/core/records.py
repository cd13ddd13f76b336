"""Records: the decision log and the per-request record, shared by live and simulation.

Rule kept here: records are immutable values appended in the order decisions are made; nothing
reads the clock here, callers pass ``now``. The decision log is what the parity test compares
between the simulator and the live router.

(:class:`RequestRecord` lives in :mod:`narwhal.core.request_record`, which the optional compiled
build compiles; this module is not compiled because the live router subclasses
:class:`DecisionLog`. It is re-exported here.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from narwhal.core.request_record import RequestRecord

__all__ = ["Decision", "DecisionLog", "RequestRecord"]


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
    """An append-only list of :class:`Decision`; ``enabled=False`` keeps nothing (hot paths).

    A disabled log is a no-op, so hot callers may skip calling :meth:`add` when ``enabled`` is
    False (building the call costs more than the check); a subclass that must see every
    decision keeps ``enabled`` True.
    """

    enabled: bool = True
    entries: list[Decision] = field(default_factory=list)

    def add(self, t: float, kind: str, engine: str | None = None, **detail: Any) -> None:
        if self.enabled:
            self.entries.append(Decision(t, kind, engine, tuple(sorted(detail.items()))))
