"""A sweep's recommendation: which setting, if any, beats the baseline, written as
``recommendation.json``.

Rule kept here: a setting is recommended only when :mod:`narwhal.experiments.stats` finds it
better than the baseline on the primary metric at the stated confidence and not worse on a
guard (success rate, p99 ``first_byte_s``); otherwise ``recommended`` is null and the reason
says that no setting is distinguishable at N replicates and how many would resolve the largest
difference seen. Every sweep writes one, also when it cannot decide (no baseline in the grid,
one replicate), saying why.

Theory of operation: a *setting* is a point, or, in a sweep with several cases and a varied
grid axis (faults placed in several ways, say), a grid cell over every case, judged by its worst
case per replicate. The baseline is ``[tuning] baseline`` or else the scenario's own value of
every varied grid key (read from the base scenario, or the simulator's default for a key the
file leaves out); in a sweep of cases alone, the one case that sets nothing. The setting whose
parameters match it is the baseline. Each point's per-replicate values are read at the
reference rate (``[goodput].report_at``); goodput per
replicate is the DistServe crossing of that replicate's own rate curve. Replicates are paired
by index when the sweep's seeds are by replicate (common random numbers), else compared with
Welch's interval. The primary metric is ``[tuning] primary``, else goodput (with
``[goodput]``), else SLO attainment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from narwhal.experiments.aggregate import SweepResult, mean_curve
from narwhal.experiments.plan import CASE_KEY, Plan, canonical
from narwhal.experiments.spec_model import RANKABLE
from narwhal.experiments.stats import (
    Decision,
    Interval,
    Metric,
    decide,
    paired_interval,
    welch_interval,
)
from narwhal.sim.results import goodput
from narwhal.sim.scenario import ROUTER_KEYS, ScenarioError, parse_scenario

GUARDS = ("success_pct", "first_byte_p99_s")
SHOWN = ("slo_attainment_pct", "goodput_rps")  # also compared for the figures, not decided on


@dataclass(frozen=True)
class Recommendation:
    """The decision with what it was made of (for the JSON, the figures and their CSVs)."""

    decision: Decision | None
    baseline: dict[str, Any] | None  # the baseline's parameters (None: none could be found)
    baseline_index: int | None  # the baseline's index in ``settings``
    metrics: tuple[Metric, ...]
    reason: str
    paired: bool
    values: list[dict[str, list[Any]]] = field(default_factory=list)  # per setting, per metric
    settings: list[dict[str, Any]] = field(default_factory=list)  # each setting's parameters

    @property
    def recommended_index(self) -> int | None:
        """The recommended setting's index in ``settings`` (a point's index when every point
        is a setting)."""
        return None if self.decision is None else self.decision.recommended

    def index_of(self, params: dict[str, Any]) -> int | None:
        """The index of the setting a point's parameters belong to."""
        for index, setting in enumerate(self.settings):
            if _matches(params, setting):
                return index
        return None

    def difference(self, index: int, metric: str) -> Interval | None:
        """The interval of setting ``index`` minus the baseline on ``metric`` (None for the
        baseline itself, or when there was no comparison)."""
        decision = self.decision
        if decision is None or self.baseline_index is None or index == self.baseline_index:
            return None
        for comparison in decision.comparisons:
            if comparison.cell == index and metric in comparison.intervals:
                return comparison.intervals[metric]
        if index >= len(self.values) or metric not in self.values[index]:
            return None
        interval = paired_interval if self.paired else welch_interval
        return interval(
            self.values[index][metric],
            self.values[self.baseline_index][metric],
            decision.per_cell_confidence,
        )


def primary_metric(plan: Plan) -> str:
    spec = plan.spec
    if spec.tuning.primary is not None:
        return spec.tuning.primary
    return "goodput_rps" if spec.goodput is not None else "slo_attainment_pct"


def metrics_of(plan: Plan) -> tuple[Metric, ...]:
    """The primary metric first, then the guards (the primary not repeated)."""
    primary = primary_metric(plan)
    names = [primary, *(g for g in GUARDS if g != primary)]
    return tuple(Metric(name, RANKABLE[name]) for name in names)


def _scenario_value(plan: Plan, key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted scenario key in the base scenario, else its default."""
    node: Any = plan.base
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return True, node
    try:
        # the settings alone: faults the points replace need not fit the base's workload
        scenario = parse_scenario({**plan.base, "faults": []}, "the base scenario")
    except ScenarioError:
        return False, None
    parts = key.split(".")
    if parts[0] == "router":
        obj: Any = scenario.replicas
    elif parts[0] in ROUTER_KEYS:
        obj = getattr(scenario.router, parts[0], None)
    else:
        obj = getattr(scenario, parts[0], None)
    for part in parts[1:]:
        if obj is None or not hasattr(obj, part):
            return False, None
        obj = getattr(obj, part)
    value = getattr(obj, "value", obj)  # an enum setting compares by its value
    return obj is not None, value


def baseline_of(plan: Plan) -> tuple[dict[str, Any] | None, str]:
    """The baseline's parameters, or None and why there is none."""
    spec = plan.spec
    if spec.tuning.baseline:
        return dict(spec.tuning.baseline), "[tuning] baseline"
    varied = [key for key, values in spec.grid.items() if len(values) > 1]
    if len(spec.cases) > 1 and not varied:  # the case that changes nothing is the scenario's
        plain = [case.label for case in spec.cases if not case.set]
        if len(plain) == 1:
            return {CASE_KEY: plain[0]}, "the case that leaves the scenario as it is"
        return None, "no single case leaves the scenario as it is: set [tuning] baseline"
    baseline = {}
    for key in varied:
        found, value = _scenario_value(plan, key)
        if not found:
            return None, f"the scenario has no value of {key}: set [tuning] baseline"
        baseline[key] = value
    return baseline, "the scenario's own setting"


def _matches(params: dict[str, Any], baseline: dict[str, Any]) -> bool:
    return all(key in params and params[key] == value for key, value in baseline.items())


def settings_of(plan: Plan) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """The settings compared (their parameters) and the points each one pools. With several
    cases and a varied grid axis, a setting is a grid cell over every case (judged by its worst
    case: an operator does not know which case the next incident will be); otherwise every
    point is a setting."""
    varied = [key for key, values in plan.spec.grid.items() if len(values) > 1]
    if not (len(plan.spec.cases) > 1 and varied):
        return [dict(p.params) for p in plan.points], [[p.index] for p in plan.points]
    order: list[str] = []
    groups: dict[str, tuple[dict[str, Any], list[int]]] = {}
    for point in plan.points:
        params = {k: v for k, v in point.params.items() if k != CASE_KEY}
        key = canonical(params)
        if key not in groups:
            order.append(key)
            groups[key] = (params, [])
        groups[key][1].append(point.index)
    return [groups[k][0] for k in order], [groups[k][1] for k in order]


def _worst(values: list[Any], metric: Metric) -> Any:
    if any(v is None for v in values) or not values:
        return None
    return min(values) if metric.higher_is_better else max(values)


def per_replicate(
    result: SweepResult, metrics: tuple[Metric, ...], pools: list[list[int]]
) -> list[dict[str, list[Any]]]:
    """For every setting (the points it pools), each metric's values by replicate, in
    replicate order: a point's own value, or the worst over the points it pools."""
    plan = result.plan
    reference = plan.spec.goodput.reference() if plan.spec.goodput is not None else None
    bar = plan.spec.goodput.attainment_pct if plan.spec.goodput is not None else 90.0
    replicates = range(plan.spec.sweep.replicates)
    by_cell: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for run in result.runs:
        by_cell.setdefault((run["point"], run["replicate"]), []).append(run)

    def value(point: int, k: int, metric: Metric) -> Any:
        runs = by_cell.get((point, k), [])
        if metric.name == "goodput_rps":
            return goodput(mean_curve(runs), bar)[0] if runs else None
        at = [r for r in runs if reference is None or r["rate_multiplier"] == reference]
        return at[0].get(metric.name) if at else None

    return [
        {
            metric.name: [_worst([value(p, k, metric) for p in pool], metric) for k in replicates]
            for metric in metrics
        }
        for pool in pools
    ]


def recommend(result: SweepResult) -> Recommendation:
    """The sweep's recommendation (see the module's rule)."""
    plan = result.plan
    metrics = metrics_of(plan)
    paired = plan.spec.sweep.seed_by == "replicate"
    settings, pools = settings_of(plan)
    baseline, source = baseline_of(plan)
    if baseline is None:
        return Recommendation(
            None, None, None, metrics, f"no baseline: {source}", paired, settings=settings
        )
    matching = [i for i, params in enumerate(settings) if _matches(params, baseline)]
    if not matching:
        described = ", ".join(f"{k}={v}" for k, v in baseline.items())
        return Recommendation(
            None,
            baseline,
            None,
            metrics,
            f"the baseline ({source}: {described}) is not a cell of the grid: add it, or name "
            "one with [tuning] baseline",
            paired,
            settings=settings,
        )
    base_point = matching[0]
    labels = [", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in p.items()) for p in settings]
    names = {m.name for m in metrics}
    shown = [
        Metric(name, RANKABLE[name])
        for name in SHOWN
        if name not in names and (name != "goodput_rps" or plan.spec.goodput is not None)
    ]
    values = per_replicate(result, (*metrics, *shown), pools)
    decision = decide(
        values,
        base_point,
        metrics,
        labels=labels,
        confidence=plan.spec.tuning.confidence,
        paired=paired,
    )
    return Recommendation(
        decision, baseline, base_point, metrics, decision.reason, paired, values, settings
    )


def _number(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 6)


def as_json(result: SweepResult, recommendation: Recommendation) -> dict[str, Any]:
    """``recommendation.json``'s content."""
    plan = result.plan
    decision = recommendation.decision
    chosen = recommendation.recommended_index
    recommended = None
    settings = recommendation.settings
    if chosen is not None:
        varied = {k for k, values in plan.spec.grid.items() if len(values) > 1}
        varied |= set(recommendation.baseline or {})
        if len(plan.spec.cases) > 1:
            varied.add(CASE_KEY)
        recommended = {k: v for k, v in settings[chosen].items() if k in varied}
    cells = []
    if decision is not None:
        for comparison in decision.comparisons:
            entry: dict[str, Any] = dict(settings[comparison.cell])
            for name, interval in comparison.intervals.items():
                entry[name] = {
                    "difference": _number(interval.mean),
                    "low": _number(interval.low),
                    "high": _number(interval.high),
                }
            entry["better"] = comparison.better
            entry["worse_on"] = list(comparison.worse_on)
            cells.append(entry)
    return {
        "recommended": recommended,
        "baseline": recommendation.baseline,
        "confidence": plan.spec.tuning.confidence,
        "replicates": plan.spec.sweep.replicates,
        "reason": recommendation.reason,
        "primary": recommendation.metrics[0].name,
        "guards": [m.name for m in recommendation.metrics[1:]],
        "interval": (
            ("paired t on per-replicate differences" if recommendation.paired else "Welch t")
            + ", simultaneous over the cells compared (Bonferroni)"
        ),
        "per_cell_confidence": None if decision is None else decision.per_cell_confidence,
        "replicates_needed": None if decision is None else decision.replicates_needed,
        "cells": cells,
    }
