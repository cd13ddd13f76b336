"""Workloads: when requests arrive, how long their prompts and outputs are, and what content
their prompts share.

Rule kept here: a workload is a pure function of its settings and a seeded RNG; it yields
:class:`Arrival` values (time, prompt tokens, output tokens, the prompt's content identity) in
time order and knows nothing of engines or routers.

Theory of operation: five generators.
- ``poisson``: exponential inter-arrival times at ``rate`` requests per second.
- ``gamma``: bursty arrivals, gamma inter-arrival times with mean ``1/rate`` and coefficient of
  variation ``cv`` (shape ``1/cv^2``; cv = 1 is Poisson, cv > 1 comes in bursts).
- ``trace``: replay of a bundled trace (:mod:`narwhal.sim.traces`: ``azure2023_conv``,
  ``azure2023_code``, ``mooncake_conversation``, ``mooncake_synthetic``) or a CSV/JSONL path
  with the same columns; ``start_s``/``duration_s`` cut a window, ``rate_scale`` compresses
  time (2 = twice the rate), ``repeat`` loops the trace (content included) until
  ``max_requests`` or ``duration_s`` is reached. A trace's ``hash_ids`` become its prompts'
  segments, one per 512-token block.
- ``fixed``: the listed ``arrivals_s`` (e.g. a parity or regression scenario), every request
  with ``prompt_tokens`` and ``output_tokens``; no randomness.
- ``shared_context``: groups of users sharing a long system prompt, at a rising rate
  (:mod:`narwhal.sim.shared_context`).
- ``log``: ``narwhal serve``'s request log (``log = PATH``) replayed: its arrivals, lengths and
  prompt identities (:mod:`narwhal.sim.request_log`); ``narwhal replay`` writes a scenario
  around it, with the faults the log shows.
Lengths for ``poisson`` and ``gamma`` come from a :class:`LengthDist`: fixed, uniform,
lognormal, or ``trace`` (pairs drawn from a trace's empirical distribution, so prompt and output
lengths keep their correlation). Only ``trace`` (with ``hash_ids``) and ``shared_context``
prompts have a content identity; the others share nothing. A prompt clamped to
``max_prompt_tokens`` keeps the segments of the tokens it kept.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from narwhal.sim.gpu.prefix import Segments
from narwhal.sim.shared_context import SharedContextSettings, shared_context_arrivals
from narwhal.sim.traces import (
    AZURE_CITATION,
    BUNDLED_TRACES,
    TRACE_BLOCK_TOKENS,
    load_trace,
    trace_block_ids,
    trace_citation,
)

__all__ = [
    "BUNDLED_TRACES",
    "TRACE_CITATION",
    "Arrival",
    "LengthDist",
    "WorkloadSettings",
    "arrivals",
    "generate",
    "load_trace",
    "trace_citation",
]

TRACE_CITATION = AZURE_CITATION  # the default trace's
FIXED_ONLY = frozenset({"arrivals_s", "prompt_tokens", "output_tokens"})  # kind = "fixed" keys
_NOT_FOR_LOG = frozenset({"trace", "rate", "cv", "rate_scale", "start_s", "repeat"})


@dataclass(frozen=True)
class Arrival:
    t: float
    prompt: int
    output: int
    # the prompt's content identity: (chained segment id, tokens) from its start, the tokens
    # summing to ``prompt``; empty: content no other request shares (narwhal.sim.gpu.prefix)
    prefix: Segments = ()
    cls: str = ""  # its workload class ([[workload.classes]]; empty: none are defined)


class WorkloadClass(BaseModel):
    """One ``[[workload.classes]]`` entry: a share of the arrivals with a priority band, a
    tenant (its fairness flow; default: the class name) and a TTFT objective."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    share: float = Field(gt=0)
    priority: int = Field(0, ge=-1000, le=1000)
    tenant: str = ""
    slo_ttft_s: float | None = Field(None, gt=0)

    @property
    def flow(self) -> str:
        return self.tenant or self.name


class LengthDist(BaseModel):
    """A distribution of token counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dist: Literal["fixed", "uniform", "lognormal"] = "fixed"
    value: int = Field(256, ge=1)  # fixed
    low: int = Field(1, ge=1)  # uniform (inclusive), and the lower clamp of lognormal
    high: int = Field(4096, ge=1)  # uniform (inclusive), and the upper clamp of lognormal
    median: float = Field(512.0, gt=0)  # lognormal
    sigma: float = Field(1.0, ge=0)  # lognormal

    @model_validator(mode="after")
    def _ordered(self) -> LengthDist:
        if self.dist != "fixed" and self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        return self

    def draw(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            return self.value
        if self.dist == "uniform":
            return rng.randint(self.low, self.high)
        value = round(self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)))
        return min(self.high, max(self.low, value))


class WorkloadSettings(BaseModel):
    """The ``[workload]`` section of a scenario."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["trace", "poisson", "gamma", "fixed", "shared_context", "run", "log"] = "trace"
    run: str | None = None  # kind = "run": a real run's directory (narwhal/sim/validation/runlog)
    log: str | None = None  # kind = "log": narwhal serve's JSON request log (narwhal replay)
    trace: str = "azure2023_conv"  # a bundled trace name or a file path
    rate: float = Field(5.0, gt=0)  # poisson/gamma: requests per second
    cv: float = Field(2.0, gt=0)  # gamma: coefficient of variation of inter-arrival times
    rate_scale: float = Field(1.0, gt=0)  # trace: compress time by this factor
    start_s: float = Field(0.0, ge=0)  # trace: skip this much of the trace
    duration_s: float | None = Field(None, gt=0)
    max_requests: int | None = Field(None, ge=1)
    repeat: bool = False  # trace: loop it
    prompt: LengthDist | None = None  # poisson/gamma; None: draw (prompt, output) from `trace`
    output: LengthDist | None = None
    max_prompt_tokens: int = Field(16_000, ge=1)  # longer prompts are clamped (as vLLM does)
    endpoint: Literal["completions", "chat"] = "completions"
    stream: bool = True
    arrivals_s: tuple[float, ...] | None = None  # fixed: arrival times, seconds from the start
    prompt_tokens: int = Field(256, ge=1)  # fixed: every request's prompt
    output_tokens: int = Field(16, ge=1)  # fixed: every request's max_tokens
    shared_context: SharedContextSettings | None = None  # shared_context (None: the defaults)
    classes: tuple[WorkloadClass, ...] = ()  # [[workload.classes]]: arrivals drawn by share

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSettings:
        names = [c.name for c in self.classes]
        for name in sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"classes: name {name!r} is given more than once")
        if self.kind == "fixed":
            arrivals = self.arrivals_s
            if not arrivals:
                raise ValueError("kind = \"fixed\" needs 'arrivals_s' (a non-empty list)")
            if any(not math.isfinite(t) or t < 0 for t in arrivals):
                raise ValueError("arrivals_s: times must be finite and >= 0")
            if any(later < earlier for earlier, later in itertools.pairwise(arrivals)):
                raise ValueError("arrivals_s: times must be in non-decreasing order")
            if self.prompt is not None or self.output is not None:
                raise ValueError("kind = \"fixed\" takes 'prompt_tokens' and 'output_tokens'")
            return self
        if self.kind == "log":
            if self.log is None:
                raise ValueError("kind = \"log\" needs 'log' (narwhal serve's request log)")
            if self.prompt is not None or self.output is not None:
                raise ValueError('kind = "log" takes its lengths from the log')
            unused = sorted(_NOT_FOR_LOG & self.model_fields_set)
            if unused:
                raise ValueError(
                    f'{", ".join(unused)}: not used by kind = "log" (it replays the log\'s own '
                    "arrival times)"
                )
        elif self.log is not None:
            raise ValueError("'log' is only for kind = \"log\"")
        if self.kind == "run":
            if self.run is None:
                raise ValueError("kind = \"run\" needs 'run' (a run directory)")
            if self.prompt is not None or self.output is not None:
                raise ValueError('kind = "run" takes its lengths from the run')
        elif self.run is not None:
            raise ValueError("'run' is only for kind = \"run\"")
        fixed_only = sorted(FIXED_ONLY & self.model_fields_set)
        if fixed_only:
            raise ValueError(f'{", ".join(fixed_only)}: only for kind = "fixed"')
        if self.kind == "shared_context":
            if self.prompt is not None or self.output is not None:
                raise ValueError(
                    'kind = "shared_context" takes its lengths from [workload.shared_context]'
                )
            return self  # its stages bound it
        if self.shared_context is not None:
            raise ValueError('[workload.shared_context] needs kind = "shared_context"')
        if self.kind in ("run", "log"):
            return self  # the run (the log) bounds it
        if self.duration_s is None and self.max_requests is None:
            raise ValueError("give 'duration_s' or 'max_requests' (or both)")
        if (self.prompt is None) != (self.output is None):
            raise ValueError("give both 'prompt' and 'output' distributions, or neither")
        return self


def _trace_arrivals(w: WorkloadSettings) -> Iterator[Arrival]:
    window = [
        (row, ids)
        for row, ids in zip(load_trace(w.trace), trace_block_ids(w.trace), strict=True)
        if row[0] >= w.start_s
    ]
    if not window:
        return
    rows = tuple(row for row, _ in window)
    prefixes = tuple(_trace_segments(ids, row[1]) for row, ids in window)
    span = rows[-1][0] - w.start_s + (rows[-1][0] - rows[0][0]) / max(1, len(rows) - 1)
    if w.repeat and span <= 0:
        raise ValueError(
            "workload.repeat: the trace window spans no time (every request in it arrives at "
            f"{rows[0][0]:g} s), so it cannot be looped"
        )
    offset = 0.0
    while True:
        for (t, prompt, output), prefix in zip(rows, prefixes, strict=True):
            yield Arrival((t - w.start_s + offset) / w.rate_scale, prompt, output, prefix)
        if not w.repeat:
            return
        offset += span


def _trace_segments(ids: tuple[int, ...], prompt: int) -> Segments:
    """A trace prompt's segments: one per block id, the last one what is left of the prompt."""
    if not ids:
        return ()
    last = prompt - TRACE_BLOCK_TOKENS * (len(ids) - 1)
    return (*((i, TRACE_BLOCK_TOKENS) for i in ids[:-1]), (ids[-1], last))


def _clamped(prefix: Segments, tokens: int) -> Segments:
    """The segments of the first ``tokens`` tokens of a prompt made of ``prefix``."""
    kept: list[tuple[int, int]] = []
    for segment_id, length in prefix:
        if tokens <= 0:
            break
        kept.append((segment_id, min(length, tokens)))
        tokens -= length
    return tuple(kept)


def _synthetic(w: WorkloadSettings, rng: random.Random) -> Iterator[Arrival]:
    pairs = load_trace(w.trace) if w.prompt is None else ()
    mean_gap = 1.0 / w.rate
    shape = 1.0 / (w.cv * w.cv)
    t = 0.0
    while True:
        if w.kind == "poisson":
            t += rng.expovariate(w.rate)
        else:
            t += rng.gammavariate(shape, mean_gap / shape)
        if w.prompt is not None and w.output is not None:
            yield Arrival(t, w.prompt.draw(rng), w.output.draw(rng))
        else:
            _, prompt, output = pairs[rng.randrange(len(pairs))]
            yield Arrival(t, prompt, output)


def _fixed(w: WorkloadSettings) -> Iterator[Arrival]:
    for t in w.arrivals_s or ():
        yield Arrival(float(t), w.prompt_tokens, w.output_tokens)


def _shared_context(w: WorkloadSettings, rng: random.Random) -> Iterator[Arrival]:
    settings = w.shared_context or SharedContextSettings()
    for t, prompt, output, prefix in shared_context_arrivals(settings, rng):
        yield Arrival(t, prompt, output, prefix)


def _run(w: WorkloadSettings) -> Iterator[Arrival]:
    """A real run's requests: arrivals as the engine queued them, lengths as it served them,
    prompt content identity where the run's dataset gives it."""
    from pathlib import Path

    from narwhal.sim.validation.runlog import read_run

    requests = read_run(Path(w.run or "")).requests
    for request in sorted(requests, key=lambda r: r.arrival_s):
        yield Arrival(request.arrival_s, request.prompt, request.output, request.segments)


def _log(w: WorkloadSettings) -> Iterator[Arrival]:
    """A router's request log replayed (narwhal.sim.request_log)."""
    from narwhal.sim.request_log import log_arrivals, read_request_log

    for t, prompt, output, prefix in log_arrivals(read_request_log(w.log or "")):
        yield Arrival(t, prompt, output, prefix)


def arrivals(w: WorkloadSettings, rng: random.Random) -> Iterator[Arrival]:
    """The workload's arrivals in time order, made one at a time (a run of millions of requests
    never holds them all); empty when the workload has none."""
    source: Iterator[Arrival]
    if w.kind == "fixed":
        source = _fixed(w)
    elif w.kind == "trace":
        source = _trace_arrivals(w)
    elif w.kind == "shared_context":
        source = _shared_context(w, rng)
    elif w.kind == "run":
        source = _run(w)
    elif w.kind == "log":
        source = _log(w)
    else:
        source = _synthetic(w, rng)
    pick = _class_picker(w, rng)
    for count, arrival in enumerate(source):
        if w.duration_s is not None and arrival.t >= w.duration_s:
            return
        if w.max_requests is not None and count >= w.max_requests:
            return
        if arrival.prompt > w.max_prompt_tokens:
            prefix = _clamped(arrival.prefix, w.max_prompt_tokens)
            arrival = Arrival(arrival.t, w.max_prompt_tokens, arrival.output, prefix)
        yield arrival if pick is None else dataclasses.replace(arrival, cls=pick())


def _class_picker(w: WorkloadSettings, rng: random.Random) -> Callable[[], str] | None:
    """Draws each arrival's class by share from an RNG of its own, seeded from the workload
    RNG's state without drawing from it (the arrivals are those of the same run without
    classes); None when no classes are defined."""
    if not w.classes:
        return None
    own = random.Random("classes/" + ",".join(str(word) for word in rng.getstate()[1][:8]))
    names = [c.name for c in w.classes]
    weights = list(itertools.accumulate(c.share for c in w.classes))
    return lambda: own.choices(names, cum_weights=weights)[0]


def no_requests(w: WorkloadSettings) -> ValueError:
    """The error for a workload with no arrivals."""
    window = f" after start_s = {w.start_s:g} s" if w.kind == "trace" else ""
    return ValueError(f"the workload has no requests{window}: nothing to simulate")


def generate(w: WorkloadSettings, rng: random.Random) -> list[Arrival]:
    """Every arrival of the workload, in time order."""
    out = list(arrivals(w, rng))
    if not out:
        raise no_requests(w)
    return out
