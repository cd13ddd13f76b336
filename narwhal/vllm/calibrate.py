"""Measure a live producer/consumer pair and fit the linear engine timing of the emulator and
simulator: ``python -m narwhal.vllm.calibrate --producer URL --consumer URL``.

Rule: measure only what a router sees, through the engines' public HTTP API: sequential
requests (the linear model has no batching), unique prompts (no prefix-cache hits), greedy
decoding, each point repeated and its fastest run kept (interference from other work on the
machine only ever adds time, so the minimum is the estimate least disturbed by it).

Theory of operation. The linear timing (``narwhal emulate`` flags, the simulator's
``[fleet.linear]``) has four parameters: ``overhead_s``, ``prefill_s_per_token``,
``decode_s_per_token`` and ``kv_s_per_token``. In it a prefill leg of ``P`` prompt tokens (a
one-token completion) takes ``overhead + prefill * P + decode``, a decode leg's first token
comes ``kv * P (+ c)`` after its request, and then a token every ``decode``. For each prompt
length in a grid, handoffs are timed: the prefill leg on the producer (HTTP round trip), then
a streamed decode on the consumer carrying the producer's descriptor (time to its first token,
then to its last one, over the tokens after the first: a chunk can carry several tokens when the
engine is behind, so chunks are not counted as tokens; ``usage`` says how many there were).
``decode`` is the median of that time per token over all handoffs; ``prefill`` and
``overhead`` come from a least-squares line through the prefill legs; ``kv`` from a line through
the decode legs' first-token times (its intercept is reported as
``decode_first_token_base_s``). The report gives every point with the model's prediction and
relative error, and a ``[fleet.linear]`` TOML block to paste into a simulation scenario.

``narwhal calibrate --engine URL [--decode-engine URL]`` (:func:`calibrate_engine`) measures
any OpenAI-compatible vLLM the same way and adds the batch: prefill time against prompt length
(one-token completions on ``--engine``, or the prefill legs of handoffs when a decode engine is
given), decode step time against the number of concurrent streams on the decode engine (``B``
streams of ``T`` tokens against ``B`` streams of one token, sent at once: the difference of the
times to their last token, over ``T - 1``; see :func:`time_batch`), and, with a decode engine,
the KV pull from handoffs. It fits the simulator's ``[fleet.linear]`` including
``decode_s_per_seq`` (a step of ``B`` decodes takes ``decode_s_per_token + decode_s_per_seq *
(B - 1)``) and ``kv_setup_s``, and reports every point's relative error and their mean per kind
(the fit error). Token counts come from the engine's ``usage`` (any
tokenizer); streams use ``ignore_eos`` and ``continuous_usage_stats`` (vLLM's extensions) so a
chunk's token count is known even when a chunk carries several tokens.

Uses httpx (a project dependency); never touches torch or vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from narwhal.vllm.engines import MODEL_NAME, PREFILL_KV_PARAMS

DEFAULT_LENGTHS = (16, 128, 384, 768, 1280)
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:"


@dataclass(frozen=True)
class Sample:
    """One timed handoff."""

    prompt_tokens: int
    prefill_s: float  # producer HTTP leg, one-token completion
    first_token_s: float  # consumer: request sent -> first generated token
    decode_s_per_token: float  # consumer: first -> last token, over the tokens after the first


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


@dataclass
class Calibration:
    producer: str
    consumer: str
    samples: list[Sample]
    overhead_s: float = 0.0
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    kv_s_per_token: float = 0.0
    decode_first_token_base_s: float = 0.0
    points: list[dict[str, float]] = field(default_factory=list)

    def toml(self) -> str:
        return (
            "[fleet.linear]\n"
            f"overhead_s = {self.overhead_s:.6g}\n"
            f"prefill_s_per_token = {self.prefill_s_per_token:.6g}\n"
            f"decode_s_per_token = {self.decode_s_per_token:.6g}\n"
            f"kv_s_per_token = {self.kv_s_per_token:.6g}\n"
        )

    def median_error(self, key: str) -> float:
        return statistics.median(p[key] for p in self.points)


def fit_line(xs: Sequence[float], ys: Sequence[float], *, relative: bool = False) -> Line:
    """Least squares ``y = a + b x`` (needs two distinct x): ordinary, or with ``relative``
    minimising the squared *relative* errors ``((a + b x - y) / y)^2`` (weights ``1 / y^2``),
    so that one large point (a 16-stream step at a knee, a slow outlier) cannot pull the line
    away from the small ones, which are what a lightly loaded workload runs at."""
    if len(set(xs)) < 2:
        raise ValueError("need at least two distinct x values")
    if not relative:
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
        return Line(mean_y - slope * mean_x, slope)
    if any(y <= 0 for y in ys):
        raise ValueError("a relative fit needs positive y values")
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    swx = sum(wi * x for wi, x in zip(w, xs, strict=True))
    swy = sum(wi * y for wi, y in zip(w, ys, strict=True))
    swxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    swxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=True))
    slope = (sw * swxy - swx * swy) / (sw * swxx - swx * swx)
    return Line((swy - slope * swx) / sw, slope)


def unique_prompt(length: int, rng: random.Random) -> str:
    """``length`` characters (``length + 1`` tokens with the tiny model) never sent before."""
    head = uuid.uuid4().hex[:12] + " "
    return (head + "".join(rng.choice(ALPHABET) for _ in range(length)))[:length]


def time_handoff(
    http: httpx.Client, producer: str, consumer: str, prompt: str, model: str, tokens: int
) -> Sample:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "temperature": 0}
    started = time.perf_counter()
    reply = http.post(
        producer + "/v1/completions",
        json={**body, "max_tokens": 1, "stream": False, "kv_transfer_params": PREFILL_KV_PARAMS},
    )
    prefill_s = time.perf_counter() - started
    reply.raise_for_status()
    answer = reply.json()
    params = answer["kv_transfer_params"]
    prompt_tokens = int(answer["usage"]["prompt_tokens"])
    decode = {
        **body,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "kv_transfer_params": params,
    }
    stamps: list[float] = []
    generated = 0
    started = time.perf_counter()
    with http.stream("POST", consumer + "/v1/completions", json=decode) as stream:
        stream.raise_for_status()
        for line in stream.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"consumer stream error: {event['error']}")
            if any(choice.get("text") for choice in event.get("choices", [])):
                stamps.append(time.perf_counter())
            if event.get("usage"):
                generated = int(event["usage"]["completion_tokens"])
    if not stamps or generated < 2:
        raise RuntimeError(f"consumer generated {generated} tokens, expected {tokens}")
    # A chunk may carry several tokens when the engine is behind; the first carries one.
    per_token = (stamps[-1] - stamps[0]) / (generated - 1)
    return Sample(prompt_tokens, prefill_s, stamps[0] - started, per_token)


def calibrate(
    producer: str,
    consumer: str,
    *,
    model: str = MODEL_NAME,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    repeats: int = 5,
    tokens: int = 64,
    seed: int = 0,
) -> Calibration:
    """Time ``repeats`` handoffs per prompt length (plus one warm-up) and fit the model."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    with httpx.Client(timeout=120) as http:
        time_handoff(http, producer, consumer, unique_prompt(32, rng), model, 8)  # warm-up
        for _ in range(repeats):
            for length in lengths:
                prompt = unique_prompt(length, rng)
                samples.append(time_handoff(http, producer, consumer, prompt, model, tokens))
    return fit(producer, consumer, samples)


def fit(producer: str, consumer: str, samples: list[Sample]) -> Calibration:
    """The four linear parameters from timed handoffs, with per-point errors."""
    by_length: dict[int, list[Sample]] = {}
    for sample in samples:
        by_length.setdefault(sample.prompt_tokens, []).append(sample)
    lengths = sorted(by_length)
    prefill = [min(s.prefill_s for s in by_length[n]) for n in lengths]
    first = [min(s.first_token_s for s in by_length[n]) for n in lengths]
    decode = statistics.median(s.decode_s_per_token for s in samples)
    prefill_line = fit_line(lengths, prefill)
    first_line = fit_line(lengths, first)
    result = Calibration(producer, consumer, samples)
    result.decode_s_per_token = decode
    result.prefill_s_per_token = max(prefill_line.slope, 0.0)
    result.overhead_s = max(prefill_line.intercept - decode, 0.0)
    result.kv_s_per_token = max(first_line.slope, 0.0)
    result.decode_first_token_base_s = max(first_line.intercept, 0.0)
    for n, measured_prefill, measured_first in zip(lengths, prefill, first, strict=True):
        predicted_prefill = result.overhead_s + result.prefill_s_per_token * n + decode
        predicted_first = result.decode_first_token_base_s + result.kv_s_per_token * n
        result.points.append(
            {
                "prompt_tokens": n,
                "prefill_s": measured_prefill,
                "prefill_predicted_s": predicted_prefill,
                "prefill_rel_error": abs(predicted_prefill - measured_prefill) / measured_prefill,
                "first_token_s": measured_first,
                "first_token_predicted_s": predicted_first,
                "first_token_rel_error": abs(predicted_first - measured_first) / measured_first,
            }
        )
    return result


def report(result: Calibration) -> str:
    lines = [
        f"calibrated {result.producer} -> {result.consumer} ({len(result.samples)} handoffs)",
        f"{'tokens':>7} {'prefill ms':>11} {'model':>8} {'err':>6}  "
        f"{'1st token ms':>12} {'model':>8} {'err':>6}",
    ]
    for p in result.points:
        lines.append(
            f"{int(p['prompt_tokens']):>7} {p['prefill_s'] * 1e3:>11.1f} "
            f"{p['prefill_predicted_s'] * 1e3:>8.1f} {p['prefill_rel_error']:>6.1%}  "
            f"{p['first_token_s'] * 1e3:>12.1f} {p['first_token_predicted_s'] * 1e3:>8.1f} "
            f"{p['first_token_rel_error']:>6.1%}"
        )
    lines.append(
        f"decode: {result.decode_s_per_token * 1e3:.2f} ms/token "
        f"({1 / result.decode_s_per_token:.0f} tokens/s per stream)"
        if result.decode_s_per_token > 0
        else "decode: no gaps measured"
    )
    lines.append(result.toml().rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------- one engine (narwhal calibrate)


@dataclass(frozen=True)
class PrefillSample:
    """One one-token completion: prompt tokens (from ``usage``) and its HTTP round trip."""

    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class StepSample:
    """``batch`` concurrent streams: the decode step time while all of them were decoding."""

    batch: int
    step_s: float


@dataclass
class EngineCalibration:
    """The fitted ``[fleet.linear]`` of an engine (and its decode engine), with its error."""

    engine: str
    decode_engine: str
    model: str
    prefill: list[PrefillSample]
    steps: list[StepSample]
    handoffs: list[Sample]
    overhead_s: float = 0.0
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    decode_s_per_seq: float = 0.0
    kv_s_per_token: float = 0.0
    kv_setup_s: float = 0.0
    statistic: str = "median"
    points: list[dict[str, Any]] = field(default_factory=list)

    def parameters(self) -> dict[str, float]:
        return {
            "overhead_s": self.overhead_s,
            "prefill_s_per_token": self.prefill_s_per_token,
            "decode_s_per_token": self.decode_s_per_token,
            "decode_s_per_seq": self.decode_s_per_seq,
            "kv_s_per_token": self.kv_s_per_token,
            "kv_setup_s": self.kv_setup_s,
        }

    def fit_error(self) -> dict[str, float]:
        """Mean relative error (absolute) of the model against the measured points, per kind
        (``prefill``, ``step``, ``first_token``), and ``all``."""
        errors: dict[str, list[float]] = {}
        for point in self.points:
            errors.setdefault(str(point["kind"]), []).append(abs(float(point["rel_error"])))
        errors["all"] = [abs(float(point["rel_error"])) for point in self.points]
        return {kind: statistics.fmean(values) for kind, values in errors.items() if values}

    def toml(self) -> str:
        """A scenario ``[fleet]`` snippet: the linear timing with the fitted parameters."""
        errors = ", ".join(f"{k} {v:.1%}" for k, v in self.fit_error().items())
        pair = self.decode_engine != self.engine
        lines = [
            f"# narwhal calibrate: {self.engine}"
            + (f" (prefill) -> {self.decode_engine} (decode)" if pair else "")
            + f", model {self.model}",
            f"# fit error (mean |relative|): {errors}",
            "[fleet]",
            "# engine counts: set them to the fleet to simulate",
            *(["prefill = 1", "decode = 1"] if pair else ["both = 1"]),
            'timing = "linear"',
            "",
            "[fleet.linear]",
            *(f"{name} = {value:.6g}" for name, value in self.parameters().items()),
        ]
        return "\n".join(lines) + "\n"


def _completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def served_model(http: httpx.Client, engine: str) -> str:
    """The first model ``GET /v1/models`` lists."""
    reply = http.get(engine + "/v1/models")
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])


def time_prefill(http: httpx.Client, engine: str, model: str, prompt: str) -> PrefillSample:
    """One non-streamed one-token completion, timed over HTTP."""
    started = time.perf_counter()
    reply = http.post(engine + "/v1/completions", json=_completion_body(model, prompt, 1))
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    return PrefillSample(int(reply.json()["usage"]["prompt_tokens"]), seconds)


async def _stream(
    http: httpx.AsyncClient, engine: str, body: dict[str, Any]
) -> list[tuple[float, int]]:
    """(time, tokens generated so far) at every chunk that carried text."""
    marks: list[tuple[float, int]] = []
    async with http.stream("POST", engine + "/v1/completions", json=body) as stream:
        stream.raise_for_status()
        async for line in stream.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream error from {engine}: {event['error']}")
            if not any(choice.get("text") for choice in event.get("choices", [])):
                continue
            usage = event.get("usage") or {}
            count = int(usage.get("completion_tokens") or (marks[-1][1] + 1 if marks else 1))
            marks.append((time.perf_counter(), count))
    return marks


def steady_step_s(streams: Sequence[Sequence[tuple[float, int]]]) -> float:
    """The step time while every stream was decoding: in the window from the last stream's
    first token to the first stream's last token, each stream's time per token; the median.
    A window too short (under 4 tokens of a stream) falls back to the whole stream."""
    streams = [marks for marks in streams if marks]
    if not streams:
        raise RuntimeError("no stream generated any text: no decode step to time")
    start = max(marks[0][0] for marks in streams)
    end = min(marks[-1][0] for marks in streams)
    per_token: list[float] = []
    for marks in streams:
        inside = [m for m in marks if start <= m[0] <= end]
        if len(inside) < 2 or inside[-1][1] - inside[0][1] < 4:
            inside = list(marks)
        tokens = inside[-1][1] - inside[0][1]
        if tokens > 0:
            per_token.append((inside[-1][0] - inside[0][0]) / tokens)
    if not per_token:
        raise RuntimeError("streams generated under two tokens: no decode step to time")
    return statistics.median(per_token)


async def _batch_span(
    http: httpx.AsyncClient,
    engine: str,
    body: dict[str, Any],
    batch: int,
    rng: random.Random,
    prompt_length: int,
) -> tuple[float, list[list[tuple[float, int]]]]:
    """``batch`` concurrent streams: seconds from sending them to the last token of all."""
    prompts = [unique_prompt(prompt_length, rng) for _ in range(batch)]
    sent = time.perf_counter()
    streams = await asyncio.gather(
        *(_stream(http, engine, {**body, "prompt": prompt}) for prompt in prompts)
    )
    return max(marks[-1][0] for marks in streams if marks) - sent, streams


async def time_batch(
    engine: str,
    model: str,
    batch: int,
    tokens: int,
    rng: random.Random,
    timeout: float = 300,
    prompt_length: int = 24,
) -> StepSample:
    """The decode step of ``batch`` concurrent streams (unique prompts of ``prompt_length``
    characters, short by default): the span from sending ``batch`` streams of ``tokens`` tokens
    to their last token, less the span of ``batch`` one-token streams (the prefill and the HTTP
    round trip), over ``tokens - 1``.

    A client's clock cannot see a step directly on a busy machine: when the API server is
    starved of CPU the engine keeps stepping and the tokens arrive later in a burst, so gaps
    between chunks read as zero. The send time is immune to that and the last token is only
    ever late, so the difference of two spans is not biased low. When it comes out <= 0 (noise)
    the steady-window estimate (:func:`steady_step_s`) is used instead."""
    body = {
        **_completion_body(model, "", tokens),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    limits = httpx.Limits(max_connections=batch + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        one = {**body, "max_tokens": 1}
        short, _ = await _batch_span(http, engine, one, batch, rng, prompt_length)
        full, streams = await _batch_span(http, engine, body, batch, rng, prompt_length)
    step = (full - short) / (tokens - 1)
    return StepSample(batch, step if step > 0 else steady_step_s(streams))


def calibrate_engine(
    engine: str,
    decode_engine: str | None = None,
    *,
    model: str | None = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    repeats: int = 3,
    tokens: int = 48,
    seed: int = 0,
    statistic: str = "median",
) -> EngineCalibration:
    """Measure ``engine`` (prefill) and ``decode_engine`` (decode steps; default: ``engine``)
    and fit the linear timing. With a distinct decode engine, the prefill points are the
    prefill legs of real handoffs (``kv_transfer_params`` as Narwhal sends them), which also
    time the KV pull; otherwise plain one-token completions, and no KV term. ``statistic``
    (``median`` or ``min``) reduces each point's repeats: the median is the typical time, what
    a workload's p50 sees on a machine shared with other work; the minimum is the least
    disturbed one."""
    rng = random.Random(seed)
    decoder = decode_engine or engine
    pair = decoder != engine
    with httpx.Client(timeout=120) as http:
        name = model or served_model(http, engine)
        prefill: list[PrefillSample] = []
        handoffs: list[Sample] = []
        if pair:
            time_handoff(http, engine, decoder, unique_prompt(32, rng), name, 8)  # warm-up
        else:
            time_prefill(http, engine, name, unique_prompt(32, rng))
        for _ in range(repeats):
            for length in lengths:
                prompt = unique_prompt(length, rng)
                if pair:
                    sample = time_handoff(http, engine, decoder, prompt, name, 8)
                    handoffs.append(sample)
                    prefill.append(PrefillSample(sample.prompt_tokens, sample.prefill_s))
                else:
                    prefill.append(time_prefill(http, engine, name, prompt))
    steps = [
        asyncio.run(time_batch(decoder, name, batch, tokens, rng))
        for _ in range(repeats)
        for batch in batches
    ]
    return fit_engine(engine, decoder, name, prefill, steps, handoffs, statistic)


def _reduce(pairs: Sequence[tuple[int, float]], statistic: str) -> tuple[list[int], list[float]]:
    """One value per x (the median or the minimum of its repeats), x ascending."""
    if statistic not in ("median", "min"):
        raise ValueError(f"statistic must be 'median' or 'min', not {statistic!r}")
    by_x: dict[int, list[float]] = {}
    for x, y in pairs:
        by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    pick = statistics.median if statistic == "median" else min
    return xs, [float(pick(by_x[x])) for x in xs]


def fit_engine(
    engine: str,
    decode_engine: str,
    model: str,
    prefill: list[PrefillSample],
    steps: list[StepSample],
    handoffs: list[Sample],
    statistic: str = "median",
) -> EngineCalibration:
    """Least-squares lines through each point's ``statistic`` of its repeats: the step time
    against the batch, by relative error (``decode_s_per_token`` is its value at one stream,
    ``decode_s_per_seq`` its slope; see :func:`fit_line`), the prefill leg against the prompt
    (``overhead_s`` is its intercept less one decode step), the decode legs' first token
    against the prompt (``kv_s_per_token`` is its slope, ``kv_setup_s`` its intercept less one
    decode step: the simulated decode leg's first token is the KV pull, then one step)."""
    result = EngineCalibration(engine, decode_engine, model, prefill, steps, handoffs)
    result.statistic = statistic
    batches, step_s = _reduce([(s.batch, s.step_s) for s in steps], statistic)
    if len(batches) >= 2:
        step_line = fit_line(batches, step_s, relative=True)
        result.decode_s_per_seq = max(step_line.slope, 0.0)
        result.decode_s_per_token = max(step_line.at(1), 1e-9)
    else:
        result.decode_s_per_token = step_s[0]
    lengths, prefill_s = _reduce([(p.prompt_tokens, p.seconds) for p in prefill], statistic)
    prefill_line = fit_line(lengths, prefill_s)
    result.prefill_s_per_token = max(prefill_line.slope, 0.0)
    result.overhead_s = max(prefill_line.intercept - result.decode_s_per_token, 0.0)
    first_lengths: list[int] = []
    first_s: list[float] = []
    if handoffs:
        first_lengths, first_s = _reduce(
            [(h.prompt_tokens, h.first_token_s) for h in handoffs], statistic
        )
        first_line = fit_line(first_lengths, first_s)
        result.kv_s_per_token = max(first_line.slope, 0.0)
        if first_line.slope < 0:  # no growth with the prompt: a constant is the better fit
            first_line = Line(statistics.fmean(first_s), 0.0)
        result.kv_setup_s = max(first_line.intercept - result.decode_s_per_token, 0.0)
    d, s = result.decode_s_per_token, result.decode_s_per_seq

    def point(kind: str, x: int, measured: float, predicted: float) -> dict[str, Any]:
        return {
            "kind": kind,
            "x": x,
            "measured_s": measured,
            "predicted_s": predicted,
            "rel_error": (predicted - measured) / measured,
        }

    for b, measured in zip(batches, step_s, strict=True):
        result.points.append(point("step", b, measured, d + s * (b - 1)))
    for n, measured in zip(lengths, prefill_s, strict=True):
        predicted = result.overhead_s + result.prefill_s_per_token * n + d
        result.points.append(point("prefill", n, measured, predicted))
    for n, measured in zip(first_lengths, first_s, strict=True):
        predicted = result.kv_setup_s + result.kv_s_per_token * n + d
        result.points.append(point("first_token", n, measured, predicted))
    return result


def engine_report(result: EngineCalibration) -> str:
    """The measured points against the model, the parameters and the fit error."""
    labels = {
        "prefill": "prefill leg, prompt tokens",
        "step": "decode step, concurrent streams",
        "first_token": "decode leg first token (KV pull), prompt tokens",
    }
    lines = [
        f"calibrated {result.engine}"
        + (f" -> {result.decode_engine}" if result.decode_engine != result.engine else "")
        + f" (model {result.model}; {len(result.prefill)} prefills, "
        f"{len(result.steps)} batches, {len(result.handoffs)} handoffs; "
        f"{result.statistic} of each point's repeats)"
    ]
    for kind, label in labels.items():
        points = [p for p in result.points if p["kind"] == kind]
        if not points:
            continue
        lines.append(f"{label:<48} {'measured ms':>11} {'model ms':>9} {'error':>7}")
        for p in points:
            lines.append(
                f"{p['x']:>48} {p['measured_s'] * 1e3:>11.2f} {p['predicted_s'] * 1e3:>9.2f} "
                f"{p['rel_error']:>+7.1%}"
            )
    lines.append("parameters:")
    for name, value in result.parameters().items():
        lines.append(f"  {name:<20} {value:.6g}")
    errors = result.fit_error()
    lines.append(
        "fit error (mean |relative|): "
        + ", ".join(f"{kind} {value:.1%}" for kind, value in errors.items())
    )
    return "\n".join(lines)


def engine_json(result: EngineCalibration) -> dict[str, Any]:
    data = asdict(result)
    data["parameters"] = result.parameters()
    data["fit_error"] = result.fit_error()
    data["toml"] = result.toml()
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m narwhal.vllm.calibrate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--producer", required=True, help="producer base URL")
    parser.add_argument("--consumer", required=True, help="consumer base URL")
    parser.add_argument("--model", default=MODEL_NAME)
    from narwhal.vllm.commands import counts_problem, int_list  # `narwhal calibrate`'s checks

    parser.add_argument("--lengths", type=int_list, default=list(DEFAULT_LENGTHS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per handoff")
    parser.add_argument("--out", type=Path, help="write the samples and fit as JSON")
    args = parser.parse_args(argv)
    lengths = args.lengths
    problem = counts_problem(args.repeats, args.tokens)
    if problem is not None:
        parser.error(problem)
    try:
        result = calibrate(
            args.producer.rstrip("/"),
            args.consumer.rstrip("/"),
            model=args.model,
            lengths=lengths,
            repeats=args.repeats,
            tokens=args.tokens,
        )
    except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as error:
        print(f"calibrate: {error}", file=sys.stderr)
        return 1
    print(report(result))
    if args.out:
        data = asdict(result)
        data["toml"] = result.toml()
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
