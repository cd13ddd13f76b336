"""``narwhal replay``'s scenario: a router's request log as a TOML scenario an operator can read,
edit and sweep (its traffic as ``[workload] kind = "log"``, its fleet as ``[[engines]]``, its
engines' failures as ``[[faults]]``).

Rule kept here: every part of the scenario says, in a comment, where in the log it came from
(line numbers), and what the log cannot say is written as a default with a comment saying so
(the engines' GPU and model); a fault that cannot be acted out on its engine is a comment
naming why, never dropped in silence. The text is checked by the scenario parser before it is
returned, so what ``narwhal replay`` writes always loads.

Theory of operation: :func:`replay_scenario` reads the log (:mod:`narwhal.sim.request_log`),
derives its fault history (:mod:`narwhal.sim.fault_history`) and writes, in order: a header
(requests, span, statuses, ejections seen), ``[engine]`` and ``[recovery]`` from the log's last
``router`` line (defaults without one), ``[[engines]]`` (the router lines' fleet, and any
other engine the requests used, its role inferred from where it stood in the requests' engine
lists), ``[fleet]``, ``[workload]``, ``[[faults]]`` and ``[sim]``.
"""

from __future__ import annotations

import datetime
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from narwhal.core.requests import CHAT
from narwhal.sim.fault_history import FaultHistory, derive
from narwhal.sim.faults import targets
from narwhal.sim.request_log import RequestLog, read_request_log
from narwhal.sim.scenario import parse_scenario

DAY_S = 86_400.0


@dataclass(frozen=True)
class Replay:
    """A written scenario and what went into it."""

    text: str
    log: RequestLog
    history: FaultHistory
    roles: dict[str, str]  # engine URL -> role, as written
    faults: int  # [[faults]] entries written


def _wall(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="seconds")


def _table(name: str, values: dict[str, Any]) -> str:
    body = tomli_w.dumps({k: v for k, v in values.items() if v is not None})
    return f"[{name}]\n{body}"


def _array_entry(name: str, values: dict[str, Any]) -> str:
    body = tomli_w.dumps({k: v for k, v in values.items() if v is not None})
    return f"[[{name}]]\n{body}"


def _lines(lines: tuple[int, int]) -> str:
    first, last = lines
    return f"line {first}" if first == last else f"lines {first}-{last}"


def fleet_roles(log: RequestLog) -> tuple[dict[str, str], list[str]]:
    """Engine URL -> role (router lines first, then inferred), and a comment line per source."""
    roles: dict[str, str] = {}
    notes: list[str] = []
    for router in log.routers:
        for url, role in router.engines:
            roles[url] = role
    if log.routers:
        lines = ", ".join(str(r.line) for r in log.routers)
        notes.append(f"from the log's router line(s) (line {lines})")
    positions: dict[str, set[str]] = {}
    for request in log.requests:
        engines = request.engines
        for index, url in enumerate(engines):
            if url in roles:
                continue
            leg = "decode" if len(engines) == 1 or index % 2 == 1 else "prefill"
            positions.setdefault(url, set()).add(leg)
    for url, legs in positions.items():
        roles[url] = "both" if len(legs) == 2 else legs.pop()
    if positions:
        notes.append(
            f"{', '.join(positions)}: used by requests, in no router line; role inferred from "
            "where it stood in the requests' engine lists (producer first, consumer second)"
        )
    return roles, notes


def replay_scenario(path: str | Path) -> Replay:
    """The scenario replaying the request log at ``path`` (module docstring); a
    :class:`~narwhal.sim.request_log.LogError` says what is wrong with the log."""
    log = read_request_log(path)
    history = derive(log)
    roles, fleet_notes = fleet_roles(log)
    span = log.end - log.t0
    statuses = Counter(r.status for r in log.requests)
    out: list[str] = [
        f"# A replay of the router's request log {path}, written by `narwhal replay`.",
        f"# {len(log.requests)} requests from {_wall(log.t0)} to {_wall(log.end)} "
        f"({span:.1f} s); statuses: "
        + ", ".join(f"{status} x {n}" for status, n in sorted(statuses.items())),
        "# Times below are seconds from the first request's arrival (the replay's time 0).",
    ]
    for action in history.actions:
        out.append(
            f"# the router: {action.event.removeprefix('engine_')} {action.engine} at "
            f"{action.at:.3f} s ({action.detail}; log line {action.line})"
        )
    if log.skipped:
        skipped = ", ".join(f"{kind} x {n}" for kind, n in sorted(log.skipped.items()))
        out.append(f"# lines not used: {skipped}")
    stem = Path(path).stem
    out.append(tomli_w.dumps({"name": f"replay-{stem}"}))
    router = log.routers[-1] if log.routers else None
    if router is not None:
        out.append(
            f"# the router's settings in force at the log's last router line ({router.line})"
        )
        out.append(_table("engine", router.engine))
        out.append(_table("recovery", router.recovery))
    else:
        out.append(
            "# the log has no router line: [engine] and [recovery] are Narwhal's defaults; set "
            "them to the router's own (docs/configuration.md)"
        )
    out.append("# the fleet: " + "; ".join(fleet_notes))
    for url, role in roles.items():
        out.append(_array_entry("engines", {"url": url, "role": role}))
    out.append(
        "# what each engine is: the log does not say; set gpu and model to your engines' "
        "(docs/simulator.md, [fleet])"
    )
    out.append(_table("fleet", {"gpu": "H200", "model": "llama3-8b"}))
    out.append(
        "# the log's requests: arrivals, prompt and output tokens, prompt identity "
        "(docs/experiments.md, Replaying the router's own traffic)"
    )
    workload: dict[str, Any] = {"kind": "log", "log": str(Path(path).resolve())}
    endpoints = Counter(r.endpoint for r in log.requests if r.endpoint is not None)
    streams = Counter(r.stream for r in log.requests if r.stream is not None)
    if endpoints and endpoints.most_common(1)[0][0] == CHAT:
        workload["endpoint"] = "chat"  # the simulated requests take the log's usual endpoint
    if streams and not streams.most_common(1)[0][0]:
        workload["stream"] = False
    out.append(_table("workload", workload))
    written = 0
    for window in history.windows:
        spec = window.spec()
        source = (
            f"# {window.failures} x {', '.join(window.faults)} on {window.engine} "
            f"(log {_lines(window.lines)}); until the {window.until}"
        )
        try:
            targets(spec, roles)
        except ValueError as error:
            out.append(f"{source}\n# not replayed: {error}\n")
            continue
        written += 1
        out.append(source)
        out.append(_array_entry("faults", spec.model_dump(exclude_unset=True)))
    for fault, n in sorted(history.not_replayed.items()):
        out.append(
            f"# not replayed: {n} x {fault} (no engine fault the simulator acts out makes it; "
            "the simulated load makes its own)"
        )
    sim: dict[str, Any] = {"seed": 0}
    timeout = float((router.engine if router else {}).get("request_timeout_s", 600.0))
    if span + timeout > DAY_S:
        sim["max_sim_s"] = round(span + timeout + 60.0)
    out.append(_table("sim", sim))
    text = "\n".join(out)
    parse_scenario(tomllib.loads(text), str(path))  # what is written always loads
    return Replay(text, log, history, roles, written)
