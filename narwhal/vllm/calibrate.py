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

Uses httpx (a project dependency); never touches torch or vLLM.
"""

from __future__ import annotations

import argparse
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


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """Ordinary least squares ``y = a + b x`` (needs two distinct x)."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        raise ValueError("need at least two distinct prompt lengths")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    return Line(mean_y - slope * mean_x, slope)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m narwhal.vllm.calibrate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--producer", required=True, help="producer base URL")
    parser.add_argument("--consumer", required=True, help="consumer base URL")
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per handoff")
    parser.add_argument("--out", type=Path, help="write the samples and fit as JSON")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
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
