"""The simulator's step noise and host overhead, fitted to an engine's measured decode steps.

Rule: the step noise is read from the spread of measured steps around their own batch's typical
step, by quantiles, so a few stragglers cannot widen the body and a wide body cannot pass for
stragglers; the host overhead is what a measured step takes beyond the profile's GPU time.

Theory of operation. The simulator's step noise (:mod:`narwhal.sim.gpu.stepcost`) is a uniform
body ``1 ± jitter`` times a straggler factor ``F`` with probability ``p``. :func:`fit_step_tail`
takes every per-step time a calibration read (:attr:`StepSample.gaps`), divides each by the
median of its batch (the batch's typical step: the model's), and pools the ratios:

- stragglers are the ratios above ``max(1 + 2 * j, STRAGGLER_MIN)``, where ``j`` is the
  interquartile range of the ratios (a uniform ``1 ± j`` body has an IQR of exactly ``j``, and
  reaches ``1 + j`` at most, so no body step is above ``1 + 2 j``); ``j`` is then taken again
  from the rest, the body alone;
- ``straggler_rate`` is their share of all steps, ``straggler_factor`` their median over the
  body's median (1 when there are none), ``jitter`` the body's IQR.

A straggler milder than ``STRAGGLER_MIN`` (1.5x) is counted in the body. :func:`fit_host_overhead`
takes each batch's step (the median of its repeats), less the profile model's GPU time of a
decode step of that batch (``B`` decodes of the calibration's context), and fits a line against
``B``: ``step_overhead_ms`` is its intercept, ``step_overhead_per_seq_us`` its slope, both
clamped at zero. Decode steps schedule one token per sequence, so a per-token term cannot be
told apart from the per-sequence one here: ``step_overhead_per_token_us`` is not fitted.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from narwhal.sim.timing import step_model
from narwhal.vllm.measure import StepSample

STRAGGLER_MIN = 1.5  # a step at least this many times its batch's median is a straggler
MAX_JITTER = 0.95  # the simulator needs jitter < 1
MIN_GAPS = 20  # fewer per-step times than this: no tail is fitted


@dataclass(frozen=True)
class StepTail:
    """Fitted step noise (the simulator's ``jitter``, ``straggler_rate``, ``straggler_factor``)
    and how many per-step times it came from."""

    jitter: float
    straggler_rate: float
    straggler_factor: float
    steps: int


@dataclass(frozen=True)
class HostOverhead:
    """Fitted host work per step against the profile model ``model``."""

    model: str
    step_overhead_s: float
    per_seq_s: float


def _iqr(values: Sequence[float]) -> float:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def fit_ratios(ratios: Sequence[float]) -> StepTail:
    """The noise of steps given as ratios to their typical step (see the module docstring)."""
    if len(ratios) < MIN_GAPS:
        raise ValueError(f"need at least {MIN_GAPS} per-step times, got {len(ratios)}")
    threshold = max(1.0 + 2.0 * _iqr(ratios), STRAGGLER_MIN)
    body = [r for r in ratios if r <= threshold]
    slow = [r for r in ratios if r > threshold]
    centre = statistics.median(body)
    jitter = min(_iqr(body) / centre, MAX_JITTER)
    factor = statistics.median(slow) / centre if slow else 1.0
    return StepTail(jitter, len(slow) / len(ratios), max(factor, 1.0), len(ratios))


def fit_step_tail(steps: Sequence[StepSample]) -> StepTail | None:
    """The step noise of measured batches: each per-step time over its batch's median; None
    when the samples hold too few per-step times."""
    by_batch: dict[int, list[float]] = {}
    for sample in steps:
        by_batch.setdefault(sample.batch, []).extend(g for g in sample.gaps if g > 0)
    ratios: list[float] = []
    for gaps in by_batch.values():
        if gaps:
            typical = statistics.median(gaps)
            ratios.extend(g / typical for g in gaps)
    if len(ratios) < MIN_GAPS:
        return None
    return fit_ratios(ratios)


def fit_host_overhead(
    batches: Sequence[int], step_s: Sequence[float], model: str, context_per_seq: int
) -> HostOverhead:
    """Host work per step: each batch's measured step less the profile model's decode step of
    ``B`` sequences of ``context_per_seq`` tokens, as a line against ``B``."""
    if len(set(batches)) < 2:
        raise ValueError("need decode steps at two batch sizes at least")
    gpu = step_model(model)
    extra = [
        s - gpu.batch_s(b, 0, b * context_per_seq, 0.0)
        for b, s in zip(batches, step_s, strict=True)
    ]
    slope, intercept = statistics.linear_regression(batches, extra)
    return HostOverhead(model, max(intercept, 0.0), max(slope, 0.0))
