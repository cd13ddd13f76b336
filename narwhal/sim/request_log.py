"""``narwhal serve``'s JSON request log, read back: its requests, engine events and router lines,
and the arrivals a replay of it simulates (``[workload] kind = "log"``).

Rule kept here: the log is read strictly. A line that is not a JSON object with an ``event``,
or a known line lacking a field (or holding one of the wrong type), is refused with its line
number and what is wrong (:class:`LogError`); a line of an event kind this module does not use
is counted (:attr:`RequestLog.skipped`), never guessed at. Nothing here decides what failed:
that is :mod:`narwhal.sim.fault_history`.

Theory of operation: :func:`read_request_log` parses the file into :class:`LoggedRequest`,
:class:`EngineEvent` and :class:`RouterLine` values; times stay wall-clock seconds, and
:attr:`RequestLog.t0` (the first request's arrival) is the replay's time 0. :func:`log_arrivals`
turns the requests into :class:`~narwhal.sim.workload.Arrival` values:
- arrival: its wall time less ``t0``;
- prompt tokens: as the engine reported them (``prompt_tokens``); where no engine did (the
  request failed before a prefill finished), the prompt's bytes times the log's median tokens
  per byte; without bytes either, the log's median prompt;
- output tokens: what a completed request generated (``output_tokens``); what a failed one asked
  for (``max_tokens``), else the median of the completed ones;
- prompt identity: the chained block hashes (``prefix``, :mod:`narwhal.core.prompt_identity`)
  become segments of ``LOG_BLOCK_BYTES`` x tokens-per-byte tokens each, numbered in order of
  first appearance, the prompt's rest a segment of its own; a prompt with no full block shares
  nothing.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.core.prompt_identity import LOG_BLOCK_BYTES
from narwhal.sim.gpu.prefix import Segments

TOKENS_PER_BYTE = 0.25  # English text in a BPE tokenizer, when the log gives no ratio
DEFAULT_OUTPUT = 16  # a failed request's output when nothing in the log says more


class LogError(ValueError):
    """A request log that cannot be replayed; the message names the file, line and problem."""


@dataclass(frozen=True)
class LoggedRequest:
    """One ``"event": "request"`` line."""

    line: int
    request_id: str
    arrival: float  # wall clock, s
    status: int
    outcome: str
    committed: bool
    ttft_s: float | None
    finished_s: float
    attempts: int
    engines: tuple[str, ...]
    output_tokens: int
    prompt_tokens: int | None
    max_tokens: int | None = None
    prompt_bytes: int | None = None
    prefix: tuple[str, ...] = ()
    endpoint: str | None = None  # the route (/v1/completions, /v1/chat/completions)
    stream: bool | None = None

    @property
    def ended(self) -> float:
        return self.arrival + self.finished_s


@dataclass(frozen=True)
class EngineEvent:
    """An engine-health line (``engine_ejected``, ``engine_readmitted``, ``engine_quarantined``,
    ``engine_probe_failed``) or an ``attempt_failed`` line."""

    line: int
    event: str
    time: float  # wall clock, s
    engine: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class RouterLine:
    """A ``router`` line: the fleet and the settings in force from ``time`` on."""

    line: int
    time: float
    engines: tuple[tuple[str, str], ...]  # (url, role)
    engine: dict[str, Any]
    recovery: dict[str, Any]


ENGINE_EVENTS = frozenset(
    {
        "engine_ejected",
        "engine_readmitted",
        "engine_quarantined",
        "engine_probe_failed",
        "attempt_failed",
    }
)


@dataclass
class RequestLog:
    path: str
    requests: list[LoggedRequest] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    routers: list[RouterLine] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # event kind -> lines not used

    @property
    def t0(self) -> float:
        return self.requests[0].arrival

    @property
    def end(self) -> float:
        """The last thing the log saw (wall clock)."""
        last = max(r.ended for r in self.requests)
        return max([last, *(e.time for e in self.events)])


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(kind: str, value: Any) -> bool:
    if kind == "number":
        return _number(value)
    if kind == "int":
        return _integer(value) and value >= 0
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strings":
        return isinstance(value, list) and all(isinstance(s, str) for s in value)
    return isinstance(value, dict)  # "object"


class _Line:
    """One parsed line, with typed access that blames the line and the field."""

    def __init__(self, where: str, data: dict[str, Any]) -> None:
        self.where = where
        self.data = data

    def fail(self, problem: str) -> LogError:
        return LogError(f"{self.where}: {problem}")

    def get(self, key: str, kind: str, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise self.fail(f"the {self.data['event']!r} line has no {key!r}")
        value = self.data[key]
        if value is None and optional:
            return None
        if not _fits(kind, value):
            names = {"int": "a non-negative integer", "strings": "a list of strings"}
            raise self.fail(f"{key!r} must be {names.get(kind, 'a ' + kind)}, got {value!r}")
        return value


def _request(line: _Line, number: int) -> LoggedRequest:
    prompt_tokens = line.get("prompt_tokens", "int", optional=True)
    return LoggedRequest(
        line=number,
        request_id=line.get("request_id", "str"),
        arrival=float(line.get("arrival", "number")),
        status=line.get("status", "int"),
        outcome=line.get("outcome", "str"),
        committed=line.get("committed", "bool"),
        ttft_s=line.get("ttft_s", "number", optional=True),
        finished_s=float(line.get("finished_s", "number")),
        attempts=line.get("attempts", "int"),
        engines=tuple(line.get("engines", "strings")),
        output_tokens=line.get("output_tokens", "int"),
        prompt_tokens=prompt_tokens if prompt_tokens else None,
        max_tokens=line.get("max_tokens", "int", optional=True),
        prompt_bytes=line.get("prompt_bytes", "int", optional=True),
        prefix=tuple(line.get("prefix", "strings", optional=True) or ()),
        endpoint=line.get("endpoint", "str", optional=True),
        stream=line.get("stream", "bool", optional=True),
    )


def _router_line(line: _Line, number: int) -> RouterLine:
    raw = line.data.get("engines")
    if not isinstance(raw, list) or not all(
        isinstance(e, dict) and isinstance(e.get("url"), str) and isinstance(e.get("role"), str)
        for e in raw
    ):
        raise line.fail('\'engines\' must be a list of {"url", "role"} objects')
    return RouterLine(
        line=number,
        time=float(line.get("time", "number")),
        engines=tuple((e["url"], e["role"]) for e in raw),
        engine=line.get("engine", "object"),
        recovery=line.get("recovery", "object"),
    )


def read_request_log(path: str | Path) -> RequestLog:
    """The log at ``path``, parsed (module docstring); a :class:`LogError` says what is wrong."""
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise LogError(f"cannot read the request log {path}: {error}") from None
    log = RequestLog(str(path))
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}, line {number}"
        try:
            data = json.loads(raw)
        except ValueError as error:
            raise LogError(f"{where}: not a JSON line ({error})") from None
        if not isinstance(data, dict) or not isinstance(data.get("event"), str):
            raise LogError(f'{where}: not a log line (a JSON object with an "event")')
        line = _Line(where, data)
        event = data["event"]
        if event == "request":
            log.requests.append(_request(line, number))
        elif event in ENGINE_EVENTS:
            detail = {k: v for k, v in data.items() if k not in ("event", "time", "engine")}
            engine = line.get("engine", "str")
            log.events.append(
                EngineEvent(number, event, line.get("time", "number"), engine, detail)
            )
        elif event == "router":
            log.routers.append(_router_line(line, number))
        else:
            log.skipped[event] = log.skipped.get(event, 0) + 1
    if not log.requests:
        raise LogError(f'{path}: no request lines ("event": "request"): nothing to replay')
    log.requests.sort(key=lambda r: r.arrival)
    log.events.sort(key=lambda e: e.time)
    return log


def tokens_per_byte(log: RequestLog) -> float:
    """The log's median prompt tokens per prompt byte (:data:`TOKENS_PER_BYTE` without data)."""
    ratios = [
        r.prompt_tokens / r.prompt_bytes
        for r in log.requests
        if r.prompt_tokens is not None and r.prompt_bytes
    ]
    return statistics.median(ratios) if ratios else TOKENS_PER_BYTE


def log_arrivals(log: RequestLog) -> list[tuple[float, int, int, Segments]]:
    """Each request as (time from ``t0``, prompt tokens, output tokens, segments), in order."""
    ratio = tokens_per_byte(log)
    known = [r.prompt_tokens for r in log.requests if r.prompt_tokens is not None]
    median_prompt = round(statistics.median(known)) if known else 256
    done = [r.output_tokens for r in log.requests if r.outcome == "ok" and r.output_tokens > 0]
    median_output = round(statistics.median(done)) if done else DEFAULT_OUTPUT
    block_tokens = max(1, round(LOG_BLOCK_BYTES * ratio))
    ids: dict[str, int] = {}
    for request in log.requests:
        for digest in request.prefix:
            ids.setdefault(digest, len(ids) + 1)
    out: list[tuple[float, int, int, Segments]] = []
    for number, r in enumerate(log.requests):
        if r.prompt_tokens is not None:
            prompt = r.prompt_tokens
        elif r.prompt_bytes:
            prompt = max(1, round(r.prompt_bytes * ratio))
        else:
            prompt = median_prompt
        if r.outcome == "ok" and r.output_tokens > 0:
            output = r.output_tokens
        else:
            output = r.max_tokens or median_output
        out.append(
            (
                r.arrival - log.t0,
                prompt,
                max(1, output),
                _segments(r, prompt, block_tokens, ids, number),
            )
        )
    return out


def _segments(
    request: LoggedRequest, prompt: int, block_tokens: int, ids: dict[str, int], number: int
) -> Segments:
    """The prompt's segments: its logged blocks, then its own rest (module docstring)."""
    segments: list[tuple[int, int]] = []
    left = prompt
    for digest in request.prefix:
        if left <= 0:
            break
        take = min(block_tokens, left)
        segments.append((ids[digest], take))
        left -= take
    if not segments:
        return ()
    if left > 0:
        segments.append((len(ids) + 1 + number, left))  # content no other prompt shares
    return tuple(segments)
