"""The operator's log of engine health: one JSON line per ejection, readmission, quarantine,
failed probe, a role's entering or leaving panic, and a consumer prefilling a request whose
producers all failed (``[routing] prefill_fallback = "local"``), in the router's JSON log (stdout
for ``narwhal serve``, beside the request lines).

Rule kept here: every line is a decision the core already made (the breaker's ``eject``,
``readmit``, ``quarantine`` and ``probe_result`` entries of the decision log), written as it is
made, never a judgement of its own; ejections and readmissions are always written, while
quarantines, failed probes and prefill fallbacks of one engine are written at most once per
:data:`REPEAT_INTERVAL_S` (the next line says how many were left out), so a flapping engine
cannot flood the log.

Why: an operator tails the log, not ``/metrics``: vllm-router logs each circuit-breaker
transition and Envoy each outlier ejection and its end ("outlier detection event log"). Only the
counters and ``/status`` said this before.

Theory of operation: :class:`EngineEventLog` is called with each :class:`Decision` (the router
chains it after the metrics' hook); a kind it does not log returns at once. A line is
``{"event": "engine_ejected" | "engine_readmitted" | "engine_quarantined" |
"engine_probe_failed" | "role_panic" | "role_panic_end" | "prefill_fallback", "time": <epoch s>,
"engine": url,
...}`` (a panic line's ``engine`` is empty; its ``phase``, ``in_service`` and ``engines`` say
which role and how much of it was in service; the core logs entering and leaving once each)
with the decision's own details
(``reason`` and ``streak`` of an ejection, ``via`` of a readmission, ``until`` of a quarantine,
``outcome`` of a probe, ``request`` and ``reason`` of a prefill fallback, whose ``engine`` is the
consumer that prefilled) and, for an ejection, ``next_probe_at``, read from the breaker once
:meth:`~EngineEventLog.attach` has given it the router's policies.

What a replay needs besides (``narwhal replay``; written only into a JSON log, ``replay_lines``,
not as an embedder's warnings): an ``attempt_failed`` line for each attempt that failed and was
retried, or whose committed stream was resumed elsewhere (``engine`` charged, ``fault``,
``request``, and ``resumed``: true for a resumed stream, ``ended``: true for one the router
ended itself, every token delivered; the request line says only how the last attempt ended),
and at start a ``router`` line (:meth:`EngineEventLog.router_started`) with
the fleet (``engines``: url and role) and the ``[engine]`` and ``[recovery]`` settings in force.
"""

from __future__ import annotations

import json
from typing import Any

from narwhal.core.config import NarwhalConfig
from narwhal.core.policies import Policies
from narwhal.core.records import Decision
from narwhal.core.routing.disagg import PRODUCER_FAILED
from narwhal.live.clock import AnyioClock, to_wall
from narwhal.live.reporting import RequestLog

REPEAT_INTERVAL_S = 10.0  # a quarantine or failed probe of one engine: one line per interval

_EVENTS = {
    "eject": "engine_ejected",
    "readmit": "engine_readmitted",
    "quarantine": "engine_quarantined",
    "probe_result": "engine_probe_failed",
    "panic": "role_panic",
    "panic_end": "role_panic_end",
    "prefill_local": "prefill_fallback",
}
# written with replay_lines only (a resumed stream's failure is an attempt that failed too)
_REPLAY_EVENTS = {"retry": "attempt_failed", "resume": "attempt_failed"}
_RATE_LIMITED = frozenset({"quarantine", "probe_result", "prefill_local"})


class EngineEventLog:
    """Writes the engine-health lines of the decisions it is handed (see the module)."""

    def __init__(self, write: RequestLog, clock: AnyioClock, replay_lines: bool = False) -> None:
        self.write = write
        self.replay_lines = replay_lines
        self.clock = clock
        self.policies: Policies | None = None
        self._last: dict[tuple[str, str], float] = {}  # (engine, kind): when last written
        self._left_out: dict[tuple[str, str], int] = {}

    def attach(self, policies: Policies) -> None:
        self.policies = policies

    def router_started(self, config: NarwhalConfig) -> None:
        """The ``router`` line: the fleet and the settings a replay starts from."""
        if not self.replay_lines:
            return
        line = {
            "event": "router",
            "time": to_wall(self.clock, self.clock.now()),
            "engines": [{"url": e.url, "role": e.role.value} for e in config.engines],
            "engine": config.engine.model_dump(mode="json"),
            "recovery": config.recovery.model_dump(mode="json"),
        }
        self.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")

    def __call__(self, decision: Decision) -> None:
        kind = decision.kind
        event = _EVENTS.get(kind)
        if event is None:
            event = _REPLAY_EVENTS.get(kind) if self.replay_lines else None
        if event is None:
            return
        detail = dict(decision.detail)
        if kind == "probe_result" and detail.get("outcome") != "failed":
            return
        if kind == "resume":  # a committed stream's failure: one more failed attempt, resumed
            outcome = detail.get("outcome")  # (or ended by the router: the request line says ok)
            if outcome not in ("resumed", "ended"):
                return
            detail = {"fault": detail.get("reason"), "request": detail.get("request")}
            detail["resumed" if outcome == "resumed" else "ended"] = True
        if kind == "prefill_local" and detail.get("reason") != PRODUCER_FAILED:
            return  # a short prompt or a fleet without producers: routine, counted only
        engine = decision.engine or ""
        line: dict[str, Any] = {
            "event": event,
            "time": to_wall(self.clock, decision.t),
            "engine": engine,
        }
        if kind in _RATE_LIMITED:
            key = (engine, kind)
            last = self._last.get(key)
            if last is not None and decision.t - last < REPEAT_INTERVAL_S:
                self._left_out[key] = self._left_out.get(key, 0) + 1
                return
            self._last[key] = decision.t
            left_out = self._left_out.pop(key, 0)
            if left_out:
                line["left_out"] = left_out  # since the last line of this kind
        for name, value in detail.items():
            line[name] = to_wall(self.clock, value) if name == "until" else value
        if kind == "eject" and self.policies is not None:
            next_probe = self.policies.breaker.health(engine).next_probe_at
            line["next_probe_at"] = to_wall(self.clock, next_probe)
        self.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
