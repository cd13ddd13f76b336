"""The simulator's linear engine timing fitted to an engine's measurements, with its error.

Rule: every parameter comes from a least-squares line through measured points, each point the
median (or the minimum) of its repeats, and the report shows every point against the model, so
a fit is never trusted without its error beside it.

Theory of operation. The linear timing (``[fleet.linear]`` of a scenario; ``narwhal emulate``'s
flags) has six parameters. A decode step of ``B`` sequences takes ``decode_s_per_token +
decode_s_per_seq * (B - 1)``; a prefill leg of ``P`` prompt tokens takes ``overhead_s +
prefill_s_per_token * P`` and one step; a decode leg's first token comes after the KV pull,
``kv_setup_s + kv_s_per_token * P``, and one step. :func:`fit_engine` fits:

- the step line against the batch by *relative* error (:func:`fit_line`), so one large point
  (a 16-stream step at a knee) cannot pull the line away from the small ones, which are what a
  lightly loaded workload runs at: ``decode_s_per_token`` is its value at one stream,
  ``decode_s_per_seq`` its slope;
- the prefill legs against the prompt (ordinary least squares): ``prefill_s_per_token`` is the
  slope, ``overhead_s`` the intercept less one step;
- with handoffs, their first tokens against the prompt: ``kv_s_per_token`` is the slope,
  ``kv_setup_s`` the intercept less one step (a negative slope means no growth with the
  prompt, and the mean is the better constant).

The step noise (``jitter``, ``straggler_rate``, ``straggler_factor``) and, against a profile
model, the host overhead per step come from :mod:`narwhal.vllm.fit_tails`.

Negative values are clamped at zero. The fit error is the mean absolute relative error per
kind of point (``step``, ``prefill``, ``first_token``) and over all. Besides the six
parameters, the handoffs' own decodes give the median time per token of one stream right after
a KV pull (``handoff_decode_s_per_token``), reported next to the step it can be compared with.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import tomli_w

from narwhal.vllm.fit_tails import HostOverhead, StepTail, fit_host_overhead, fit_step_tail
from narwhal.vllm.measure import HandoffSample, PrefillSample, StepSample

STATISTICS = ("median", "min")


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(xs: Sequence[float], ys: Sequence[float], *, relative: bool = False) -> Line:
    """Least squares ``y = a + b x`` (needs two distinct x): ordinary, or with ``relative``
    minimising the squared *relative* errors ``((a + b x - y) / y)^2`` (weights ``1 / y^2``)."""
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


def reduce_repeats(
    pairs: Sequence[tuple[int, float]], statistic: str
) -> tuple[list[int], list[float]]:
    """One value per x (the median or the minimum of its repeats), x ascending."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be 'median' or 'min', not {statistic!r}")
    by_x: dict[int, list[float]] = {}
    for x, y in pairs:
        by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    pick = statistics.median if statistic == "median" else min
    return xs, [float(pick(by_x[x])) for x in xs]


@dataclass
class EngineCalibration:
    """The fitted ``[fleet.linear]`` of an engine (and its decode engine), with its error."""

    engine: str
    decode_engine: str
    model: str
    prefill: list[PrefillSample]
    steps: list[StepSample]
    handoffs: list[HandoffSample]
    overhead_s: float = 0.0
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    decode_s_per_seq: float = 0.0
    kv_s_per_token: float = 0.0
    kv_setup_s: float = 0.0
    handoff_decode_s_per_token: float | None = None  # median over handoffs; None: no handoffs
    statistic: str = "median"
    points: list[dict[str, Any]] = field(default_factory=list)
    tail: StepTail | None = None  # the step noise; None: too few per-step times
    host: HostOverhead | None = None  # host work against a profile model, when one was named

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
        header = [
            f"# narwhal calibrate: {self.engine}"
            + (f" (prefill) -> {self.decode_engine} (decode)" if pair else "")
            + f", model {self.model}",
            f"# fit error (mean |relative|): {errors}",
            "# engine counts: set them to the fleet to simulate",
        ]
        counts = {"prefill": 1, "decode": 1} if pair else {"both": 1}
        noise: dict[str, float] = {}
        if self.tail is not None:
            header.append(f"# step noise from {self.tail.steps} measured steps")
            noise = {
                "jitter": _g(self.tail.jitter),
                "straggler_rate": _g(self.tail.straggler_rate),
                "straggler_factor": _g(self.tail.straggler_factor),
            }
        if self.host is not None:  # the profile's GPU model plus the measured host work
            header.append(f"# host overhead: measured steps less profile model {self.host.model}")
            host = {
                "model": self.host.model,
                "timing": "fitted",
                "step_overhead_ms": _g(self.host.step_overhead_s * 1e3),
                "step_overhead_per_seq_us": _g(self.host.per_seq_s * 1e6),
            }
            fleet = {"fleet": {**counts, **host, **noise}}
        else:
            linear = {name: _g(value) for name, value in self.parameters().items()}
            fleet = {"fleet": {**counts, "timing": "linear", **noise, "linear": linear}}
        return "\n".join(header) + "\n" + tomli_w.dumps(fleet)


def _g(value: float) -> float:
    """Six significant digits: what a snippet needs, and short to read."""
    return float(f"{value:.6g}")


def _point(kind: str, x: int, measured: float, predicted: float) -> dict[str, Any]:
    return {
        "kind": kind,
        "x": x,
        "measured_s": measured,
        "predicted_s": predicted,
        "rel_error": (predicted - measured) / measured,
    }


def fit_engine(
    engine: str,
    decode_engine: str,
    model: str,
    prefill: list[PrefillSample],
    steps: list[StepSample],
    handoffs: list[HandoffSample],
    statistic: str = "median",
    profile_model: str | None = None,
    context_per_seq: int = 0,
) -> EngineCalibration:
    """The six parameters from the measurements (see the module docstring), with every point's
    prediction and relative error; the step noise; with ``profile_model``, the host overhead
    against that profile model's decode step (``context_per_seq`` tokens per sequence)."""
    result = EngineCalibration(engine, decode_engine, model, prefill, steps, handoffs)
    result.statistic = statistic
    batches, step_s = reduce_repeats([(s.batch, s.step_s) for s in steps], statistic)
    result.tail = fit_step_tail(steps)
    if profile_model is not None:
        result.host = fit_host_overhead(batches, step_s, profile_model, context_per_seq)
    if len(batches) >= 2:
        step_line = fit_line(batches, step_s, relative=True)
        result.decode_s_per_seq = max(step_line.slope, 0.0)
        result.decode_s_per_token = max(step_line.at(1), 1e-9)
    else:
        result.decode_s_per_token = step_s[0]
    lengths, prefill_s = reduce_repeats([(p.prompt_tokens, p.seconds) for p in prefill], statistic)
    prefill_line = fit_line(lengths, prefill_s)
    result.prefill_s_per_token = max(prefill_line.slope, 0.0)
    result.overhead_s = max(prefill_line.intercept - result.decode_s_per_token, 0.0)
    first_lengths: list[int] = []
    first_s: list[float] = []
    if handoffs:
        first_lengths, first_s = reduce_repeats(
            [(h.prompt_tokens, h.first_token_s) for h in handoffs], statistic
        )
        first_line = fit_line(first_lengths, first_s)
        result.kv_s_per_token = max(first_line.slope, 0.0)
        if first_line.slope < 0:  # no growth with the prompt: a constant is the better fit
            first_line = Line(statistics.fmean(first_s), 0.0)
        result.kv_setup_s = max(first_line.intercept - result.decode_s_per_token, 0.0)
        result.handoff_decode_s_per_token = statistics.median(
            h.decode_s_per_token for h in handoffs
        )
    d, s = result.decode_s_per_token, result.decode_s_per_seq
    for b, measured in zip(batches, step_s, strict=True):
        result.points.append(_point("step", b, measured, d + s * (b - 1)))
    for n, measured in zip(lengths, prefill_s, strict=True):
        predicted = result.overhead_s + result.prefill_s_per_token * n + d
        result.points.append(_point("prefill", n, measured, predicted))
    for n, measured in zip(first_lengths, first_s, strict=True):
        predicted = result.kv_setup_s + result.kv_s_per_token * n + d
        result.points.append(_point("first_token", n, measured, predicted))
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
    tail = result.tail
    if tail is not None:
        lines.append(
            f"step noise ({tail.steps} steps, each over its batch's median): jitter "
            f"{tail.jitter:.3g}, straggler_rate {tail.straggler_rate:.3g}, straggler_factor "
            f"{tail.straggler_factor:.3g}"
        )
    if result.host is not None:
        lines.append(
            f"host overhead beyond profile model {result.host.model}'s decode step: "
            f"{result.host.step_overhead_s * 1e3:.3g} ms + {result.host.per_seq_s * 1e6:.3g} "
            "us per sequence"
        )
    if result.handoff_decode_s_per_token is not None:
        lines.append(
            f"decode right after a KV pull (median over handoffs): "
            f"{result.handoff_decode_s_per_token * 1e3:.2f} ms/token, against a "
            f"{result.decode_s_per_token * 1e3:.2f} ms step at one stream"
        )
    errors = result.fit_error()
    lines.append(
        "fit error (mean |relative|): "
        + ", ".join(f"{kind} {value:.1%}" for kind, value in errors.items())
    )
    return "\n".join(lines)


def engine_json(result: EngineCalibration) -> dict[str, Any]:
    """Every sample, the parameters, the fit error and the ``[fleet]`` snippet, as JSON."""
    data = asdict(result)
    data["parameters"] = result.parameters()
    data["fit_error"] = result.fit_error()
    data["toml"] = result.toml()
    return data
