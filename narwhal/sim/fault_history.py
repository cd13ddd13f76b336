"""The fault history a request log shows: which engine failed how and when, as ``[[faults]]``
windows the simulator can act out, and what the router did about it (ejections, readmissions).

Rule kept here: a fault is derived only from what the router charged to an engine (the core's
:data:`~narwhal.core.errors.FAULT_RULES`: ``charged``), on the engine it charged; a failure the
simulator has no way to act out, or that is the load's doing rather than an engine's
(``handoff_too_old``), is listed in :attr:`FaultHistory.not_replayed`, never silently dropped;
what the router does not charge (``deadline``, ``no_engine``, an engine's 4xx, a client gone)
is no engine's fault, and the replay's router makes its own. The ejections and readmissions are
evidence, not faults: they say how long an engine stayed bad (its probes failed until it was
readmitted; an engine never readmitted stays bad to the log's end) and are kept to be compared
with the replay's.

Theory of operation: every failed attempt is a :class:`Failure` — a request line whose outcome
is a charged fault (the engine: the last one the request used, which is the one whose leg was
running; for ``bad_descriptor`` that is the producer), or an ``attempt_failed`` line (an attempt
retried; the line names the engine). Its time is when the failing leg opened: the request's
arrival for a producer-leg fault, plus its ``ttft_s`` (the producer leg's end, when the decode
opened) for a decode-leg one. Failures of one engine and one simulated kind (:data:`SIM_KIND`)
less than :data:`MERGE_GAP_S` apart make one window, from the first leg's opening to the
last's (when the router ejected the engine for them: until just before its readmission, or
the log's end if it was never readmitted), padded by :data:`PAD_S`; its ``probability`` is the
share of the legs opened on that engine in the window that failed. A stream fault's
``after_tokens`` is the median count of tokens the failed requests got.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from narwhal.core.errors import FAULT_RULES, FaultKind
from narwhal.sim.faults import ENGINE_FAULTS, STREAM_FAULTS, FaultSpec
from narwhal.sim.request_log import LoggedRequest, RequestLog

SIM_KIND: dict[str, str] = {
    "refused": "crash",  # connections refused: the process is down
    "reset": "crash",  # connections reset: the process died under them
    "engine_5xx": "http_5xx",
    "malformed_response": "http_5xx",  # the nearest the simulator acts out (a 502, charged)
    "bad_descriptor": "bad_descriptor",
    "first_token_timeout": "stall",  # a stream that stays silent from its start
    "silence": "stall",
    "closed_before_done": "disconnect",
    "inband_error": "inband_error",
}
"""A charged fault the router saw -> the simulated fault that makes the router see it."""
PRODUCER_LEG = frozenset({"bad_descriptor"})  # charged to the producer, whose leg it ends
MERGE_GAP_S = 30.0  # failures of one engine and kind closer than this: one window
PAD_S = 0.01  # a window starts this much before its first leg and ends this much after


@dataclass(frozen=True)
class Failure:
    """One failed attempt, charged to ``engine``."""

    at: float  # when the failing leg opened, s from the log's t0
    engine: str
    fault: str  # a FaultKind value
    tokens: int  # output tokens the client got before it (request lines; 0 otherwise)
    line: int


@dataclass(frozen=True)
class Window:
    """A derived fault: ``kind`` on ``engine`` from ``start`` to ``end`` (s from t0)."""

    engine: str
    kind: str
    start: float
    end: float
    probability: float
    after_tokens: int
    failures: int
    faults: tuple[str, ...]  # the FaultKind values it stands for
    lines: tuple[int, int]  # first and last log line of its evidence
    until: str  # what ends it: "last failure", "readmission", "end of log (never readmitted)"

    def spec(self) -> FaultSpec:
        values: dict[str, object] = {
            "kind": self.kind,
            "engine": self.engine,
            "at_s": round(self.start, 3),
            "duration_s": round(max(self.end - self.start, 0.001), 3),
        }
        if self.kind not in ENGINE_FAULTS:
            values["probability"] = round(self.probability, 3)
        if self.kind in STREAM_FAULTS:
            values["after_tokens"] = self.after_tokens
        return FaultSpec.model_validate(values)


@dataclass(frozen=True)
class Action:
    """What the router did to an engine: ejected (reason, streak) or readmitted (via)."""

    at: float
    engine: str
    event: str  # engine_ejected | engine_readmitted
    detail: str
    line: int


@dataclass
class FaultHistory:
    windows: list[Window] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    not_replayed: dict[str, int] = field(default_factory=dict)  # FaultKind value -> failures

    @property
    def ejected(self) -> list[str]:
        """The engines the router ejected, each once, in order of their first ejection."""
        return list(dict.fromkeys(a.engine for a in self.actions if a.event == "engine_ejected"))


def _charged(outcome: str) -> bool:
    try:
        return FAULT_RULES[FaultKind(outcome)].charged
    except ValueError:  # "ok", "client_gone", ...: no engine's fault
        return False


def _leg_opened(request: LoggedRequest, fault: str, t0: float) -> float:
    decode_leg = fault not in PRODUCER_LEG and len(request.engines) % 2 == 0
    if decode_leg and request.ttft_s is not None:
        return request.arrival + request.ttft_s - t0
    return request.arrival - t0


def failures(log: RequestLog) -> list[Failure]:
    """Every failed attempt charged to an engine (module docstring), in time order."""
    t0 = log.t0
    arrivals = {r.request_id: r.arrival for r in log.requests}
    found: list[Failure] = []
    for r in log.requests:
        if r.outcome == "ok" or not r.engines or not _charged(r.outcome):
            continue
        found.append(
            Failure(
                _leg_opened(r, r.outcome, t0), r.engines[-1], r.outcome, r.output_tokens, r.line
            )
        )
    for e in log.events:
        if e.event != "attempt_failed":
            continue
        fault = e.detail.get("fault")
        if not isinstance(fault, str) or not _charged(fault) or not e.engine:
            continue
        request = e.detail.get("request")
        opened = arrivals.get(request, e.time) if isinstance(request, str) else e.time
        found.append(Failure(max(opened, t0) - t0, e.engine, fault, 0, e.line))
    found.sort(key=lambda f: f.at)
    return found


def _legs_opened(log: RequestLog) -> dict[str, list[float]]:
    """Per engine, when each completed request's leg on it opened (s from t0)."""
    legs: dict[str, list[float]] = defaultdict(list)
    for r in log.requests:
        if r.outcome != "ok":
            continue
        for position, engine in enumerate(r.engines):
            decode = position == len(r.engines) - 1 and r.ttft_s is not None
            legs[engine].append(r.arrival - log.t0 + ((r.ttft_s or 0.0) if decode else 0.0))
    return legs


def derive(log: RequestLog) -> FaultHistory:
    """The log's fault history (module docstring)."""
    history = FaultHistory()
    t0, end = log.t0, log.end - log.t0
    for e in log.events:
        if e.event in ("engine_ejected", "engine_readmitted"):
            if e.event == "engine_ejected":
                detail = f"reason {e.detail.get('reason')}, streak {e.detail.get('streak')}"
            else:
                detail = f"via {e.detail.get('via')}"
            history.actions.append(Action(e.time - t0, e.engine, e.event, detail, e.line))
    groups: dict[tuple[str, str], list[list[Failure]]] = defaultdict(list)
    for failure in failures(log):
        kind = SIM_KIND.get(failure.fault)
        if kind is None:
            history.not_replayed[failure.fault] = history.not_replayed.get(failure.fault, 0) + 1
            continue
        runs = groups[(failure.engine, kind)]
        if runs and failure.at - runs[-1][-1].at < MERGE_GAP_S:
            runs[-1].append(failure)
        else:
            runs.append([failure])
    legs = _legs_opened(log)
    for (engine, kind), runs in groups.items():
        for run in runs:
            history.windows.append(
                _window(engine, kind, run, legs.get(engine, []), history.actions, end)
            )
    history.windows.sort(key=lambda w: (w.start, w.engine, w.kind))
    return history


def _window(
    engine: str,
    kind: str,
    run: list[Failure],
    legs: list[float],
    actions: list[Action],
    log_end: float,
) -> Window:
    start, end, until = run[0].at, run[-1].at, "last failure"
    # ejected for it: it stayed bad (its probes failed) until just before its readmission, or
    # to the log's end if it was never readmitted
    ejected = [a.at for a in actions if a.engine == engine and a.event == "engine_ejected"]
    ejection = next((t for t in ejected if start <= t <= end + MERGE_GAP_S), None)
    if ejection is not None:
        readmitted = [
            a.at for a in actions if a.engine == engine and a.event == "engine_readmitted"
        ]
        back = next((t for t in readmitted if t > ejection), None)
        if back is None:
            end, until = max(end, log_end), "end of log (never readmitted)"
        elif back - 2 * PAD_S > end:
            end, until = back - 2 * PAD_S, "readmission"
    start, end = max(0.0, start - PAD_S), end + PAD_S
    succeeded = sum(1 for t in legs if start <= t <= run[-1].at + PAD_S)
    tokens = [f.tokens for f in run]
    return Window(
        engine=engine,
        kind=kind,
        start=start,
        end=end,
        probability=len(run) / (len(run) + succeeded),
        after_tokens=round(statistics.median(tokens)) if kind in STREAM_FAULTS else 0,
        failures=len(run),
        faults=tuple(sorted({f.fault for f in run})),
        lines=(run[0].line, run[-1].line),
        until=until,
    )
