"""Records: the decision log and the per-request record, shared by live and simulation.

Rule kept here: records are immutable values appended in the order decisions are made; nothing
reads the clock here, callers pass ``now``. The decision log is what the parity test compares
between the simulator and the live router.

Theory of operation: every policy object of a router appends to one :class:`DecisionLog`. A
driver that must react to decisions as they are made (the live router's metrics) gives the log
an ``on_decision`` callback instead of extending it, and a router that runs for weeks bounds
what it holds with ``keep``. A :class:`RequestRecord` is written once per client request, when
it ends, and handed to ``Policies.on_record``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final


class Decision:
    """One policy decision: a placement, an ejection, a readmission, a client status...

    Immutable (``Final``), equal and hashed by its four values. A plain class rather than a
    frozen dataclass: the compiled build makes it a native class (a frozen dataclass's
    ``__init__`` stays interpreted there), and every request makes several."""

    __slots__ = ("detail", "engine", "kind", "t")

    def __init__(
        self,
        t: float,
        kind: str,  # place | eject | readmit | probe | quarantine | retry | status | stale
        engine: str | None = None,
        detail: tuple[tuple[str, Any], ...] = (),
    ) -> None:
        self.t: Final = t
        self.kind: Final = kind
        self.engine: Final = engine
        self.detail: Final = detail

    def _values(self) -> tuple[float, str, str | None, tuple[tuple[str, Any], ...]]:
        return (self.t, self.kind, self.engine, self.detail)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decision) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        t, kind, engine, detail = self._values()
        return f"Decision(t={t!r}, kind={kind!r}, engine={engine!r}, detail={detail!r})"

    def as_dict(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "engine": self.engine, **dict(self.detail)}


@dataclass
class DecisionLog:
    """An append-only list of :class:`Decision`; ``enabled=False`` keeps nothing.

    ``on_decision``, when given, is called with each decision as it is added. ``keep``, when
    given, bounds the memory: once more than twice that many are held, all but the newest
    ``keep`` are dropped. A disabled log calls nothing, so a caller may skip building a call to
    :meth:`add` when ``enabled`` is False.
    """

    enabled: bool = True
    entries: list[Decision] = field(default_factory=list)
    on_decision: Callable[[Decision], None] | None = None
    keep: int | None = None

    def add(self, t: float, kind: str, engine: str | None = None, **detail: Any) -> None:
        if not self.enabled:
            return
        decision = Decision(t, kind, engine, tuple(sorted(detail.items())))
        self.entries.append(decision)
        if self.keep is not None and len(self.entries) > 2 * self.keep:
            del self.entries[: -self.keep]
        if self.on_decision is not None:
            self.on_decision(decision)


class RequestRecord:
    """What one client request did. Durations are seconds from arrival at the router, on the
    clock the caller passes. Immutable (``Final``); two records are equal when they say the
    same (:meth:`as_dict`)."""

    __slots__ = (
        "arrival",
        "attempts",
        "committed",
        "engines",
        "error",
        "finished_s",
        "first_byte_s",
        "outcome",
        "output_tokens",
        "prefill_fallback",
        "prompt_tokens",
        "request_id",
        "resume_refused",
        "resumes",
        "status",
        "ttft_s",
    )

    def __init__(
        self,
        *,
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
        prompt_tokens: int | None = None,
        prefill_fallback: bool = False,
        resumes: int = 0,
        resume_refused: str | None = None,
    ) -> None:
        self.request_id: Final = request_id
        self.arrival: Final = arrival
        self.status: Final = status
        self.outcome: Final = outcome  # "ok", the FaultKind value that ended it, "client_gone"
        self.committed: Final = committed  # HTTP 200 was sent before the end (streaming)
        self.ttft_s: Final = ttft_s  # producer HTTP leg completed (last attempt that got there)
        # first generated decode output observed by the router (last attempt that got there)
        self.first_byte_s: Final = first_byte_s
        self.finished_s: Final = finished_s  # end of the request
        self.attempts: Final = attempts
        self.engines: Final = engines  # every engine used, in order (producer, consumer, ...)
        self.output_tokens: Final = output_tokens  # generated-output events (last decode)
        self.error: Final = error
        # the prompt's tokens as an engine reported them (usage.prompt_tokens; None: no engine
        # said; the router has no tokenizer)
        self.prompt_tokens: Final = prompt_tokens
        # the consumer prefilled the prompt after every producer attempt failed
        # ([routing] prefill_fallback = "local")
        self.prefill_fallback: Final = prefill_fallback
        # how many times the committed stream was resumed on another consumer
        # (narwhal.core.resume), and why its last committed failure was not (None: it was, or
        # nothing failed after commit, or resuming is off)
        self.resumes: Final = resumes
        self.resume_refused: Final = resume_refused

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RequestRecord) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.as_dict().items())
        return f"RequestRecord({fields})"

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
            "prompt_tokens": self.prompt_tokens,
            "prefill_fallback": self.prefill_fallback,
            "error": self.error,
            "resumes": self.resumes,
            "resume_refused": self.resume_refused,
        }
