"""Aggregation: run rows, per-point rows (means over replicates) and DistServe goodput.

Rule kept here: aggregation is a pure function of the plan and the outcomes in plan order, and
its CSV text is byte-stable (fixed column order, floats rounded to 6 decimals, no wall time).

A :class:`SweepResult` is what a finished sweep adds up to (its plan, outcomes and both kinds of
rows): :mod:`narwhal.experiments.sweep` makes it and :mod:`narwhal.experiments.figures` draws it,
so it lives here, below both.

Theory of operation. A *run row* is one simulation: point, replicate, rate multiplier, seed,
the point's parameters and fleet counts, then the worker's metrics. A *point row* averages a
point's runs over replicates; with ``[goodput]`` only the runs at the reference multiplier
(``report_at``) feed those means. Means skip missing values (a p99 with no successful
request); ``*_sd`` columns give the spread between replicates (population standard deviation)
and ``*_ci_low``/``*_ci_high`` the Student t interval of the mean over replicates at
``[tuning] confidence`` (goodput's: of the per-replicate crossings). How each point differs
from the baseline, paired replicate by replicate, is :mod:`narwhal.experiments.recommendation`.

Goodput follows DistServe (Zhong et al., OSDI 2024): the highest request rate at which at least
``attainment_pct`` (90%) of requests are on time. A point's rate curve is its mean over
replicates (mean offered rate, mean attainment, per rate multiplier), scanned upwards to the
first rate that misses the bar; goodput is the linear interpolation of the 90% crossing between
it and the rate below. If even the lowest rate misses, goodput is 0 and ``goodput_bound`` is
``below`` (an upper bound: less than the lowest rate tried); if no rate misses it is the highest
rate tried and ``goodput_bound`` is ``above`` (a lower bound). Averaging the curves before
reading the crossing keeps one unlucky replicate (a fault that sinks attainment at one rate)
from zeroing the estimate; ``goodput_rps_sd`` is the spread of the per-replicate crossings.
``goodput_per_engine`` divides goodput by the point's engine count.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from narwhal.experiments.plan import Plan
from narwhal.experiments.spec_model import SweepSpec
from narwhal.experiments.stats import mean_interval
from narwhal.experiments.worker import CLASS_PREFIX, ERROR_PREFIX, METRIC_FIELDS, RunOutcome
from narwhal.sim.results import goodput

FLEET_FIELDS = ("prefill", "decode", "both", "engines")
SPREAD_FIELDS = ("success_pct", "first_byte_p99_s", "slo_attainment_pct")


@dataclass
class SweepResult:
    """A finished sweep: the spec as run, its plan, every run's outcome and the rows made of
    them (what ``--out`` gets and what a recipe draws)."""

    spec: SweepSpec
    plan: Plan
    outcomes: list[RunOutcome]
    run_fields: list[str]
    runs: list[dict[str, Any]]
    point_fields: list[str]
    points: list[dict[str, Any]]
    quick: bool = False

    @property
    def wall_s(self) -> float:
        """CPU-side wall time summed over runs (informational only)."""
        return sum(o.wall_s for o in self.outcomes)

    @property
    def requests(self) -> int:
        return sum(int(o.metrics["requests"]) for o in self.outcomes)


def mean_curve(runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(mean offered rate, mean attainment %) per rate multiplier, in increasing rate."""
    by_rate: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_rate[run["rate_multiplier"]].append(run)
    return [
        (
            sum(r["offered_rps"] or 0.0 for r in group) / len(group),
            sum(r["slo_attainment_pct"] for r in group) / len(group),
        )
        for _, group in sorted(by_rate.items())
    ]


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if v is not None]
    return sum(numbers) / len(numbers) if numbers else None


def _sd(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if v is not None]
    if not numbers:
        return None
    mean = sum(numbers) / len(numbers)
    return math.sqrt(sum((v - mean) ** 2 for v in numbers) / len(numbers))


def _interval(row: dict[str, Any], key: str, values: list[Any], confidence: float) -> None:
    """``<key>_ci_low``/``_ci_high``: the t interval of the mean over replicates (empty with
    fewer than two)."""
    interval = mean_interval(values, confidence)
    for end, value in (("low", interval.low), ("high", interval.high)):
        row[f"{key}_ci_{end}"] = None if math.isnan(value) else value


def error_fields(outcomes: list[RunOutcome]) -> list[str]:
    """Every ``errors.<class>`` column seen, sorted."""
    return sorted({k for o in outcomes for k in o.metrics if k.startswith(ERROR_PREFIX)})


def class_fields(outcomes: list[RunOutcome]) -> list[str]:
    """Every ``class.<name>.<metric>`` column seen: classes in the order the scenario lists
    them, metrics in :data:`~narwhal.experiments.worker.CLASS_FIELDS` order (none when the
    scenario has no workload classes)."""
    seen: dict[str, None] = {}
    for outcome in outcomes:
        for key in outcome.metrics:
            if key.startswith(CLASS_PREFIX):
                seen.setdefault(key, None)
    return list(seen)


def param_fields(plan: Plan) -> list[str]:
    return list(plan.points[0].params) if plan.points else []


def run_rows(plan: Plan, outcomes: list[RunOutcome]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one row per run), in plan order."""
    errors = error_fields(outcomes)
    classes = class_fields(outcomes)
    fields = ["point", "replicate"]
    if plan.spec.goodput is not None:
        fields.append("rate_multiplier")
    fields += ["seed", *param_fields(plan), *FLEET_FIELDS, *METRIC_FIELDS, *errors, *classes]
    rows = []
    for task, outcome in zip(plan.tasks, outcomes, strict=True):
        row: dict[str, Any] = {
            "point": task.point,
            "replicate": task.replicate,
            "rate_multiplier": task.rate_multiplier,
            "seed": task.seed,
            **plan.points[task.point].params,
            **plan.engines[task.point],
            **{k: 0 for k in errors},
            **outcome.metrics,
        }
        rows.append(row)
    return fields, rows


def point_rows(plan: Plan, runs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, one row per point): means over replicates, spreads, goodput."""
    goodput_cfg = plan.spec.goodput
    confidence = plan.spec.tuning.confidence
    reference = goodput_cfg.reference() if goodput_cfg is not None else None
    errors = sorted({k for r in runs for k in r if k.startswith(ERROR_PREFIX)})
    by_point: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in runs:
        by_point[row["point"]].append(row)
    fields = ["point", *param_fields(plan), *FLEET_FIELDS, "replicates", *METRIC_FIELDS]
    fields += [f"{k}_sd" for k in SPREAD_FIELDS]
    fields += [f"{k}_ci_{end}" for k in SPREAD_FIELDS for end in ("low", "high")]
    if goodput_cfg is not None:
        fields += ["goodput_rps", "goodput_rps_sd", "goodput_per_engine", "goodput_bound"]
        fields += ["goodput_rps_ci_low", "goodput_rps_ci_high"]
    fields += errors
    classes = list(dict.fromkeys(k for r in runs for k in r if k.startswith(CLASS_PREFIX)))
    for key in classes:  # per workload class: the mean and its interval over replicates
        fields += [key, f"{key}_ci_low", f"{key}_ci_high"]
    rows = []
    for point in plan.points:
        mine = by_point[point.index]
        reported = [r for r in mine if reference is None or r["rate_multiplier"] == reference]
        row = {"point": point.index, **point.params, **plan.engines[point.index]}
        row["replicates"] = len({r["replicate"] for r in reported})
        for key in (*METRIC_FIELDS, *errors):
            row[key] = _mean(
                [r.get(key, 0 if key.startswith(ERROR_PREFIX) else None) for r in reported]
            )
        for key in SPREAD_FIELDS:
            row[f"{key}_sd"] = _sd([r[key] for r in reported])
            _interval(row, key, [r[key] for r in reported], confidence)
        for key in classes:
            values = [r.get(key) for r in reported]
            row[key] = _mean(values)
            _interval(row, key, [v for v in values if v is not None], confidence)
        if goodput_cfg is not None:
            bar = goodput_cfg.attainment_pct
            value, bound = goodput(mean_curve(mine), bar)
            per_replicate = [
                goodput(mean_curve([r for r in mine if r["replicate"] == k]), bar)[0]
                for k in sorted({r["replicate"] for r in mine})
            ]
            engines = plan.engines[point.index]["engines"]
            row["goodput_rps"] = value
            row["goodput_rps_sd"] = _sd(per_replicate)
            row["goodput_per_engine"] = value / engines if engines else None
            row["goodput_bound"] = bound
            _interval(row, "goodput_rps", per_replicate, confidence)
        rows.append(row)
    return fields, rows


def unrun_faults(result: SweepResult) -> list[tuple[int, dict[str, Any], int, int]]:
    """Scheduled faults (``at_s``) that some runs ended before: (index in ``[[faults]]``, the
    fault, runs that missed it, runs of that scenario). A run whose simulated time ended at or
    before ``at_s`` never had the fault; a figure must not list it as if it happened."""
    missed: dict[int, list[int]] = {}
    faults: dict[int, dict[str, Any]] = {}
    for task, outcome in zip(result.plan.tasks, result.outcomes, strict=True):
        end = outcome.metrics.get("sim_time_s")
        for index, fault in enumerate(task.scenario.get("faults", [])):
            if "at_s" not in fault or end is None:
                continue
            faults.setdefault(index, fault)
            tally = missed.setdefault(index, [0, 0])
            tally[1] += 1
            if float(fault["at_s"]) >= float(end):
                tally[0] += 1
    return [(i, faults[i], n, total) for i, (n, total) in sorted(missed.items()) if n]


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return round(value, 6)
    return value


def csv_text(fields: list[str], rows: list[dict[str, Any]]) -> str:
    """CSV with a header, missing values empty, floats rounded to 6 decimals."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in fields})
    return buffer.getvalue()
