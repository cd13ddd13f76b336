"""Engine step time: a closed-form model fitted to a measured GPU profile.

Rule kept here: the time of one engine iteration is a pure function of what the batch holds,
``max(W, b + c * batch_tokens) + h * sum(decode context) + a * prefill attention pairs``, plus a
per-step CPU overhead, times a slow-down factor and a seeded jitter that the caller draws. The
coefficients are fitted once per model by (relative, i.e. 1/y-weighted) least squares; nothing
here is tuned by hand.

Theory of operation: the profile (``data/h200_profile.json``) holds per-layer times of
prefills (one prompt of T tokens) and decodes (B sequences of context L) plus the LM head. A
whole-model step is ``layers * layer_ms + lm_head(rows)``. The linear part (weights streamed
from HBM, then GEMMs that grow with tokens) is ``max(W, b + c*T)``: a memory floor W, then a
compute slope. Decode attention reads every cached token once: ``h * sum(context)``. Prefill
attention is causal and compute-bound: a chunk of C new tokens after K cached ones does about
``C*K + C*C/2`` query-key pairs, weighted by ``a``. The fit picks W by a grid search and, for
each W, solves b, c, h, a by least squares on the points above the floor (iterated until the
split is stable). :func:`fit_report` states the fit error against every profile point; the
model without ``a`` (the usual closed form for GEMM profiles) is reported too, for comparison.

:class:`LinearStepTiming` is the alternative for ``[fleet] timing = "linear"``: the live engine
emulator's linear model (no fit, no batching effects), so a simulated fleet and an emulated one
can be timed alike (the sim-versus-live parity test). Engines use either through
:class:`StepTiming`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol

import numpy as np

PROFILE_FILE = "h200_profile.json"


@lru_cache(maxsize=1)
def load_profile() -> dict[str, Any]:
    """The bundled H200 profile (see ``narwhal/sim/data/README.md``)."""
    text = resources.files("narwhal.sim").joinpath("data", PROFILE_FILE).read_text("utf-8")
    profile: dict[str, Any] = json.loads(text)
    return profile


def model_names() -> list[str]:
    return sorted(load_profile()["models"])


@dataclass(frozen=True)
class StepModel:
    """Fitted coefficients, in seconds. ``step_s`` is the hot path: keep it arithmetic only."""

    model: str
    floor_s: float  # W
    base_s: float  # b
    per_token_s: float  # c
    per_context_s: float  # h: per cached token read by a decode
    per_pair_s: float  # a: per query-key pair of prefill attention
    kv_bytes_per_token: int
    layers: int

    @property
    def reads_longest_context(self) -> bool:
        return False

    def step_s(self, batch_tokens: int, decode_context: int, prefill_pairs: float) -> float:
        linear = self.base_s + self.per_token_s * batch_tokens
        if linear < self.floor_s:
            linear = self.floor_s
        return linear + self.per_context_s * decode_context + self.per_pair_s * prefill_pairs

    def batch_s(
        self,
        decodes: int,
        prefill_tokens: int,
        decode_context: int,
        prefill_pairs: float,
        prefill_seqs: int = 0,
        longest_context: int = 0,
    ) -> float:
        """The :class:`StepTiming` interface: :meth:`step_s` of ``decodes + prefill_tokens``."""
        linear = self.base_s + self.per_token_s * (decodes + prefill_tokens)
        if linear < self.floor_s:
            linear = self.floor_s
        return linear + self.per_context_s * decode_context + self.per_pair_s * prefill_pairs


class StepTiming(Protocol):
    """What an engine needs from a timing model: one step's duration, and KV bytes per token."""

    @property
    def kv_bytes_per_token(self) -> int: ...

    @property
    def reads_longest_context(self) -> bool:
        """Whether :meth:`batch_s` reads ``longest_context`` (else the engine need not track
        it)."""
        ...

    def batch_s(
        self,
        decodes: int,
        prefill_tokens: int,
        decode_context: int,
        prefill_pairs: float,
        prefill_seqs: int = 0,
        longest_context: int = 0,
    ) -> float:
        """One step's GPU time: ``decodes`` decoding sequences (their contexts summing to
        ``decode_context``, the longest ``longest_context``) and ``prefill_seqs`` prefill chunks
        of ``prefill_tokens`` tokens in all (``prefill_pairs`` query-key pairs of attention
        between them)."""
        ...


@dataclass(frozen=True)
class LinearStepTiming:
    """The live emulator's ``LinearTiming`` (``narwhal emulate``) as a step model.

    Same four parameters and meaning as :class:`narwhal.emulator.timing.LinearTiming`, so
    a simulated engine and an emulated one take the same time for one request at a time: a
    step that generates a token takes ``decode_s_per_token``; a step that also (pre)fills ``P``
    prompt tokens adds ``overhead_s + prefill_s_per_token * P``. A prefill leg is then
    ``overhead + a * prompt + d`` (the emulator's prefill then one token), a streamed decode
    gives a token every ``d``, and a KV pull takes ``kv_s_per_token * tokens`` (the runner
    sizes the link's bandwidth for it). Concurrent requests share steps (continuous batching)
    where the emulator serves each on its own; the parity test keeps requests sequential.
    ``decode_s_per_seq`` (default 0, which the emulator has no equivalent of) adds that much per
    running decode beyond the first, so a step of ``B`` decodes takes ``decode_s_per_token +
    decode_s_per_seq * (B - 1)``: the batch-dependent step that ``narwhal calibrate`` fits;
    ``kv_setup_s`` (default 0) is a fixed time added to every KV pull (the runner's link setup).
    """

    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    kv_s_per_token: float = 0.0
    overhead_s: float = 0.0
    kv_bytes_per_token: int = 131_072
    decode_s_per_seq: float = 0.0
    kv_setup_s: float = 0.0

    def batch_s(
        self,
        decodes: int,
        prefill_tokens: int,
        decode_context: int,
        prefill_pairs: float,
        prefill_seqs: int = 0,
        longest_context: int = 0,
    ) -> float:
        step = self.decode_s_per_token
        if decodes > 1:
            step += self.decode_s_per_seq * (decodes - 1)
        if prefill_tokens > 0:
            step += self.overhead_s + self.prefill_s_per_token * prefill_tokens
        return step

    @property
    def reads_longest_context(self) -> bool:
        return False

    def link_bandwidth_gbps(self) -> float:
        """A link bandwidth (GB/s) that moves one token's KV in ``kv_s_per_token``."""
        if self.kv_s_per_token <= 0:
            return 1e9  # as good as instantaneous
        return self.kv_bytes_per_token / self.kv_s_per_token / 1e9


@dataclass(frozen=True)
class ProfilePoint:
    kind: str  # "prefill" | "decode"
    batch: int
    tokens_or_context: int
    measured_s: float
    predicted_s: float

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class FitReport:
    model: StepModel
    points: tuple[ProfilePoint, ...]
    plain_mean_error: float  # the same fit without the prefill-attention term
    plain_max_error: float

    @property
    def mean_error(self) -> float:
        return float(np.mean([abs(p.rel_error) for p in self.points]))

    @property
    def max_error(self) -> float:
        return float(np.max([abs(p.rel_error) for p in self.points]))


def _points(entry: dict[str, Any]) -> tuple[list[tuple[str, int, int]], np.ndarray, np.ndarray]:
    """Profile points as (kind, batch, n) and the design columns T, C, Q and measured y (s)."""
    layers = int(entry["config"]["layers"])
    rows = sorted((int(r["rows"]), float(r["ms"])) for r in entry["lm_head"])
    xs, ys = [r[0] for r in rows], [r[1] for r in rows]

    def lm_head_ms(n: int) -> float:
        return float(np.interp(n, xs, ys))

    labels: list[tuple[str, int, int]] = []
    cols: list[tuple[float, float, float, float]] = []
    for p in entry["prefill"]:
        t = int(p["tokens"])
        labels.append(("prefill", 1, t))
        cols.append((t, 0.0, t * t / 2.0, (layers * p["layer_ms"] + lm_head_ms(1)) / 1e3))
    for p in entry["decode"]:
        b, ctx = int(p["batch"]), int(p["context"])
        labels.append(("decode", b, ctx))
        cols.append((b, float(b * ctx), 0.0, (layers * p["layer_ms"] + lm_head_ms(b)) / 1e3))
    arr = np.array(cols, dtype=float)
    return labels, arr[:, :3], arr[:, 3]


def _fit(x: np.ndarray, y: np.ndarray, with_pairs: bool) -> tuple[float, np.ndarray, float]:
    """Best (W, [b, c, h, a], mean relative error) over a grid of floors W."""
    t, c_ctx, pairs = x[:, 0], x[:, 1], x[:, 2]
    weights = 1.0 / y
    best: tuple[float, np.ndarray, float] | None = None
    for floor in np.linspace(0.5 * y.min(), 1.5 * y.min(), 201):
        above = np.ones_like(t, dtype=bool)
        coef = np.zeros(4)
        for _ in range(20):
            columns = [above * 1.0, above * t, c_ctx] + ([pairs] if with_pairs else [])
            design = np.column_stack(columns)
            target = y - (~above) * floor
            sol = np.linalg.lstsq(design * weights[:, None], target * weights, rcond=None)[0]
            coef = np.append(sol, 0.0) if not with_pairs else sol
            split = (coef[0] + coef[1] * t) > floor
            if (split == above).all():
                break
            above = split
        pred = np.maximum(floor, coef[0] + coef[1] * t) + coef[2] * c_ctx + coef[3] * pairs
        err = float(np.mean(np.abs(pred - y) / y))
        if best is None or err < best[2]:
            best = (float(floor), coef, err)
    assert best is not None
    return best


@lru_cache(maxsize=8)
def fit_report(model: str) -> FitReport:
    """Fit the step model of ``model`` (a key of the profile's ``models``) and report its error."""
    models = load_profile()["models"]
    if model not in models:
        raise KeyError(f"unknown model {model!r}; the profile has {sorted(models)}")
    entry = models[model]
    labels, x, y = _points(entry)
    floor, coef, _ = _fit(x, y, with_pairs=True)
    plain_floor, plain_coef, plain_err = _fit(x, y, with_pairs=False)
    plain_pred = (
        np.maximum(plain_floor, plain_coef[0] + plain_coef[1] * x[:, 0]) + plain_coef[2] * x[:, 1]
    )
    step = StepModel(
        model=model,
        floor_s=floor,
        base_s=float(coef[0]),
        per_token_s=float(coef[1]),
        per_context_s=float(coef[2]),
        per_pair_s=float(coef[3]),
        kv_bytes_per_token=int(entry["kv_bytes_per_token_all_shards"]),
        layers=int(entry["config"]["layers"]),
    )
    points = tuple(
        ProfilePoint(
            kind,
            batch,
            n,
            float(measured),
            step.step_s(int(row[0]), int(row[1]), float(row[2])),
        )
        for (kind, batch, n), row, measured in zip(labels, x, y, strict=True)
    )
    return FitReport(
        model=step,
        points=points,
        plain_mean_error=plain_err,
        plain_max_error=float(np.max(np.abs(plain_pred - y) / y)),
    )


def step_model(model: str) -> StepModel:
    return fit_report(model).model
