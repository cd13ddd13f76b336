"""``narwhal calibrate``'s measuring run: time an engine (and its decode engine) over HTTP, then
fit the simulator's linear timing.

Rule: the measuring order is fixed and seeded (one warm-up, then ``repeats`` rounds over every
prompt length; then ``repeats`` rounds over every batch), so two calibrations of the same
engines differ only by the engines' own timing.

Theory of operation: :func:`calibrate_engine` measures with :mod:`narwhal.vllm.measure` and
fits with :func:`narwhal.vllm.fit.fit_engine` (and the step noise, and with a profile model
the host overhead, with :mod:`narwhal.vllm.fit_tails`). With a distinct decode engine, the prefill
points are the prefill legs of real handoffs (``kv_transfer_params`` as Narwhal sends them),
whose decode legs also time the KV pull and the decode right after it; otherwise plain
one-token completions, and no KV term. The batch steps are always timed on the decode engine.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

import httpx

from narwhal.vllm.fit import EngineCalibration, fit_engine
from narwhal.vllm.measure import (
    HandoffSample,
    PrefillSample,
    served_model,
    time_batch,
    time_handoff,
    time_prefill,
    unique_prompt,
)

DEFAULT_LENGTHS = (16, 128, 384, 768, 1280)  # narwhal calibrate's defaults too
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_HANDOFF_TOKENS = 8
BATCH_PROMPT_CHARS = 24  # each batch stream's prompt (short: the step is the decode's)


def calibrate_engine(
    engine: str,
    decode_engine: str | None = None,
    *,
    model: str | None = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    repeats: int = 3,
    tokens: int = 48,
    handoff_tokens: int = DEFAULT_HANDOFF_TOKENS,
    seed: int = 0,
    statistic: str = "median",
    profile_model: str | None = None,
    report: Callable[[str], None] | None = None,
) -> EngineCalibration:
    """Measure ``engine`` (prefill) and ``decode_engine`` (decode steps; default: ``engine``)
    and fit the linear timing. ``tokens`` is each batch stream's length, ``handoff_tokens``
    each handoff's decode leg's. ``statistic`` (``median`` or ``min``) reduces each point's
    repeats: the median is the typical time, what a workload's p50 sees on a machine shared
    with other work; the minimum is the least disturbed one. ``report``, if given, gets a line
    as each measurement starts (a calibration takes minutes on a CPU engine). With
    ``profile_model`` (a model of the simulator's GPU profile that the engine serves), the host
    overhead beyond that model's decode step is fitted too."""
    say = report or (lambda line: None)
    rng = random.Random(seed)
    decoder = decode_engine or engine
    pair = decoder != engine
    with httpx.Client(timeout=120) as http:
        name = model or served_model(http, engine)
        prefill: list[PrefillSample] = []
        handoffs: list[HandoffSample] = []
        if pair:
            time_handoff(http, engine, decoder, unique_prompt(32, rng), name, 8)  # warm-up
        else:
            time_prefill(http, engine, name, unique_prompt(32, rng))
        measured, planned = 0, repeats * len(lengths)
        for _ in range(repeats):
            for length in lengths:
                measured += 1
                say(
                    f"calibrate: {'handoff' if pair else 'prefill'} {measured}/{planned} "
                    f"({length}-token prompt)"
                )
                prompt = unique_prompt(length, rng)
                if pair:
                    sample = time_handoff(http, engine, decoder, prompt, name, handoff_tokens)
                    handoffs.append(sample)
                    prefill.append(PrefillSample(sample.prompt_tokens, sample.prefill_s))
                else:
                    prefill.append(time_prefill(http, engine, name, prompt))
    steps = []
    for repeat in range(repeats):
        for index, batch in enumerate(batches):
            number = repeat * len(batches) + index + 1
            say(f"calibrate: decode {number}/{repeats * len(batches)} (batch of {batch})")
            timed = time_batch(decoder, name, batch, tokens, rng, prompt_length=BATCH_PROMPT_CHARS)
            steps.append(asyncio.run(timed))
    # a batch stream's mean context: its prompt (about a token a character), half its output
    context = BATCH_PROMPT_CHARS + 1 + tokens // 2
    return fit_engine(
        engine, decoder, name, prefill, steps, handoffs, statistic, profile_model, context
    )
