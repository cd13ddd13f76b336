"""Workloads: when requests arrive and how long their prompts and outputs are.

Rule kept here: a workload is a pure function of its settings and a seeded RNG; it yields
:class:`Arrival` values (time, prompt tokens, output tokens) in time order and knows nothing of
engines or routers.

Theory of operation: four generators.
- ``poisson``: exponential inter-arrival times at ``rate`` requests per second.
- ``gamma``: bursty arrivals, gamma inter-arrival times with mean ``1/rate`` and coefficient of
  variation ``cv`` (shape ``1/cv^2``; cv = 1 is Poisson, cv > 1 comes in bursts).
- ``trace``: replay of a bundled trace (``azure2023_conv``, ``azure2023_code``: Azure LLM
  inference trace 2023, AzurePublicDataset, CC-BY-4.0) or a CSV/JSONL path with the same
  columns; ``start_s``/``duration_s`` cut a window, ``rate_scale`` compresses time (2 = twice
  the rate), ``repeat`` loops the trace until ``max_requests`` or ``duration_s`` is reached.
- ``fixed``: the listed ``arrivals_s`` (e.g. a parity or regression scenario), every request
  with ``prompt_tokens`` and ``output_tokens``; no randomness.
Lengths for the synthetic generators come from a :class:`LengthDist`: fixed, uniform,
lognormal, or ``trace`` (pairs drawn from a trace's empirical distribution, so prompt and output
lengths keep their correlation).
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from narwhal.sim.gpu.prefix import Segments

BUNDLED_TRACES = {
    "azure2023_conv": "azure2023_conv.csv",
    "azure2023_code": "azure2023_code.csv",
}
TRACE_CITATION = "Azure LLM inference trace 2023 (AzurePublicDataset, CC-BY-4.0)"
FIXED_ONLY = frozenset({"arrivals_s", "prompt_tokens", "output_tokens"})  # kind = "fixed" keys


@dataclass(frozen=True)
class Arrival:
    t: float
    prompt: int
    output: int
    # the prompt's content identity: (chained segment id, tokens) from its start, the tokens
    # summing to ``prompt``; empty: content no other request shares (narwhal.sim.gpu.prefix)
    prefix: Segments = ()


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

    kind: Literal["trace", "poisson", "gamma", "fixed"] = "trace"
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

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSettings:
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
        fixed_only = sorted(FIXED_ONLY & self.model_fields_set)
        if fixed_only:
            raise ValueError(f'{", ".join(fixed_only)}: only for kind = "fixed"')
        if self.duration_s is None and self.max_requests is None:
            raise ValueError("give 'duration_s' or 'max_requests' (or both)")
        if (self.prompt is None) != (self.output is None):
            raise ValueError("give both 'prompt' and 'output' distributions, or neither")
        return self


def _seconds(stamp: str) -> float:
    day, _, clock = stamp.strip().partition(" ")
    hours, minutes, seconds = clock.split(":")
    return (
        date.fromisoformat(day).toordinal() * 86400.0
        + int(hours) * 3600.0
        + int(minutes) * 60.0
        + float(seconds)
    )


@lru_cache(maxsize=8)
def load_trace(name: str) -> tuple[tuple[float, int, int], ...]:
    """(seconds from the first request, prompt tokens, output tokens), in time order."""
    if name in BUNDLED_TRACES:
        text = (
            resources.files("narwhal.sim").joinpath("data", BUNDLED_TRACES[name]).read_text("utf-8")
        )
    else:
        path = Path(name)
        if not path.is_file():
            raise ValueError(
                f"workload.trace: {name!r} is neither a bundled trace "
                f"({', '.join(BUNDLED_TRACES)}) nor a readable file"
            )
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"workload.trace: cannot read {name!r}: {error}") from None
    rows = _trace_rows(text, name)
    if not rows:
        raise ValueError(f"workload.trace: {name!r} holds no requests")
    rows.sort(key=lambda r: r[0])
    first = rows[0][0]
    return tuple((t - first, max(1, p), max(1, o)) for t, p, o in rows)


def _trace_rows(text: str, name: str) -> list[tuple[float, int, int]]:
    """The rows of a trace's text, or a ValueError naming the line and what is wrong with it."""
    rows: list[tuple[float, int, int]] = []
    if text.lstrip().startswith("{"):  # Mooncake-style JSONL: timestamp (ms), lengths
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                rows.append(
                    (
                        float(item["timestamp"]) / 1e3,
                        int(item["input_length"]),
                        int(item["output_length"]),
                    )
                )
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(
                    f"workload.trace {name!r} line {number}: {_why(error)} (JSONL needs "
                    "timestamp in ms, input_length and output_length)"
                ) from None
        return rows
    reader = csv.DictReader(text.splitlines())
    for number, row in enumerate(reader, start=2):  # line 1 is the header
        try:
            rows.append(
                (_seconds(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"]))
            )
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(
                f"workload.trace {name!r} line {number}: {_why(error)} (CSV needs the columns "
                "TIMESTAMP as 'YYYY-MM-DD HH:MM:SS', ContextTokens and GeneratedTokens)"
            ) from None
    return rows


def _why(error: Exception) -> str:
    return f"missing {error}" if isinstance(error, KeyError) else str(error)


def _trace_arrivals(w: WorkloadSettings) -> Iterator[Arrival]:
    rows = load_trace(w.trace)
    rows = tuple(r for r in rows if r[0] >= w.start_s)
    if not rows:
        return
    span = rows[-1][0] - w.start_s + (rows[-1][0] - rows[0][0]) / max(1, len(rows) - 1)
    if w.repeat and span <= 0:
        raise ValueError(
            "workload.repeat: the trace window spans no time (every request in it arrives at "
            f"{rows[0][0]:g} s), so it cannot be looped"
        )
    offset = 0.0
    while True:
        for t, prompt, output in rows:
            yield Arrival((t - w.start_s + offset) / w.rate_scale, prompt, output)
        if not w.repeat:
            return
        offset += span


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


def generate(w: WorkloadSettings, rng: random.Random) -> list[Arrival]:
    """Every arrival of the workload, in time order."""
    if w.kind == "fixed":
        source = _fixed(w)
    elif w.kind == "trace":
        source = _trace_arrivals(w)
    else:
        source = _synthetic(w, rng)
    out: list[Arrival] = []
    for arrival in source:
        if w.duration_s is not None and arrival.t >= w.duration_s:
            break
        if w.max_requests is not None and len(out) >= w.max_requests:
            break
        if arrival.prompt > w.max_prompt_tokens:
            arrival = Arrival(arrival.t, w.max_prompt_tokens, arrival.output)
        out.append(arrival)
    if not out:
        window = f" after start_s = {w.start_s:g} s" if w.kind == "trace" else ""
        raise ValueError(f"the workload has no requests{window}: nothing to simulate")
    return out
