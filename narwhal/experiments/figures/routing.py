"""The ``routing`` recipe: routing policies compared across offered load, one line per policy.

Rule kept here: the figure draws the sweep's one recommendation
(:mod:`narwhal.experiments.recommendation`): the baseline is the case that leaves the scenario
as it is (the shipped default policy), and a challenger is recommended only when its goodput
beats the baseline's by the stated confidence (paired over replicates) and it is not worse on
success or p99 ``first_byte_s``; otherwise none is, and the default stays. Goodput and
attainment are DistServe's (Zhong et al., OSDI 2024: on time = succeeded with ``first_byte_s <=
slo_ttft_s`` and TPOT ``<= slo_tpot_s``; goodput = the highest rate with >= 90% on time), from
:func:`narwhal.experiments.aggregate.point_rows`.

Theory of operation: each ``[[cases]]`` entry is one policy setting (``routing.prefill`` and
``routing.decode``) and one point; ``[goodput]`` runs every point at each rate multiplier. Per
(case, rate) the runs' metrics are averaged over replicates and drawn against the mean offered
rate: the client's time to first token (``first_byte_s``, p50 dashed and p90 solid), TPOT p50,
SLO attainment with the 90% bar, the rejection rate, and the prefix-cache hit rate; the last
panel is each policy's goodput, the default labelled and the recommended one ringed in red.
``routing.csv`` has one row per (case, rate multiplier) with the plotted means, the point's
goodput and whether the case is the default or recommended.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.experiments.figures.base import add_footer, pyplot, save_figure
from narwhal.experiments.recipes import RoutingOptions
from narwhal.experiments.recommendation import recommend

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult

MARKERS = "osD^vP*X"
TTFT_TICKS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
CURVE_METRICS = (
    "offered_rps",
    "first_byte_p50_s",
    "first_byte_p90_s",
    "tpot_p50_s",
    "slo_attainment_pct",
    "success_pct",
    "rejected_pct",
    "prefix_cache_hit_rate",
)


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if v is not None]
    return sum(numbers) / len(numbers) if numbers else None


def curve_rows(result: SweepResult) -> list[dict[str, Any]]:
    """One row per (case, rate multiplier): the runs' means over replicates, the point's
    goodput."""
    points = {p["point"]: p for p in result.points}
    by_rate: dict[int, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in result.runs:
        by_rate[run["point"]][run["rate_multiplier"]].append(run)
    rows = []
    for point in result.plan.points:
        summary = points[point.index]
        for multiplier, runs in sorted(by_rate[point.index].items()):
            row: dict[str, Any] = {"policy": point.params["case"], "rate_multiplier": multiplier}
            for key in CURVE_METRICS:
                row[key] = _mean([r[key] for r in runs])
            row["goodput_rps"] = summary["goodput_rps"]
            row["goodput_rps_ci_low"] = summary.get("goodput_rps_ci_low")
            row["goodput_rps_ci_high"] = summary.get("goodput_rps_ci_high")
            row["goodput_bound"] = summary["goodput_bound"]
            rows.append(row)
    return rows


def _case_note(result: SweepResult) -> str:
    parts = []
    for case in result.spec.cases:
        told = ", ".join(f"{k.removeprefix('routing.')}={v}" for k, v in case.set.items())
        parts.append(f"{case.label}: {told or 'the shipped defaults'}")
    return "Cases: " + "; ".join(parts) + "."


def _workload_title(result: SweepResult) -> str:
    first = result.plan.tasks[0].scenario if result.plan.tasks else {}
    workload, fleet = first.get("workload", {}), first.get("fleet", {})
    kind = workload.get("kind", "trace")
    what = "shared-context groups" if kind == "shared_context" else workload.get("trace", kind)
    engines = f"{fleet.get('prefill', 0)}P+{fleet.get('decode', 0)}D"
    return f"{what}, {engines} {fleet.get('model', 'llama3-8b')}"


def draw(result: SweepResult, options: RoutingOptions, out: Path) -> list[Path]:
    plt = pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    spec = result.spec
    policies = [case.label for case in spec.cases]
    rows = curve_rows(result)
    mine = {p: [r for r in rows if r["policy"] == p] for p in policies}
    advice = recommend(result)
    chosen: str | None = None
    if advice.recommended_index is not None:
        chosen = str(advice.settings[advice.recommended_index]["case"])
    for row in rows:
        row["default"] = row["policy"] == options.default
        row["recommended"] = row["policy"] == chosen

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.8))
    panels = (
        (axes[0][0], "first_byte_p90_s", "client TTFT (first_byte_s, s): p90 solid, p50 dashed"),
        (axes[0][1], "tpot_p50_s", "TPOT p50 (s)"),
        (axes[0][2], "slo_attainment_pct", "SLO attainment (% of requests on time)"),
        (axes[1][0], "rejected_pct", "rejected (% of requests answered 503)"),
        (axes[1][1], "prefix_cache_hit_rate", "prefix-cache hit rate (prompt tokens)"),
    )
    for index, policy in enumerate(policies):
        colour, marker = f"C{index}", MARKERS[index % len(MARKERS)]
        width = 2.6 if policy == options.default else 1.4
        label = policy + (" (default)" if policy == options.default else "")
        xs = [r["offered_rps"] or 0.0 for r in mine[policy]]
        for ax, metric, _ in panels:
            ys = [r[metric] for r in mine[policy]]
            ax.plot(xs, ys, marker=marker, ms=4, lw=width, color=colour, label=label)
        p50 = [r["first_byte_p50_s"] for r in mine[policy]]
        axes[0][0].plot(xs, p50, ls="--", marker=marker, ms=3, lw=1.0, color=colour)
    for ax, _, title in panels:
        ax.set_title(title, fontsize=9.5)
        ax.set_xlabel("offered load (req/s)", fontsize=8.5)
        ax.grid(True, alpha=0.3)
    ttft = [r[k] for r in rows for k in ("first_byte_p50_s", "first_byte_p90_s") if r[k]]
    axes[0][0].set_yscale("log")
    if ttft:
        low, high = min(ttft), max(ttft)
        axes[0][0].set_yticks([t for t in TTFT_TICKS_S if low / 2 <= t <= high * 2])
    axes[0][0].yaxis.set_major_formatter(ScalarFormatter())
    axes[0][0].yaxis.set_minor_formatter(NullFormatter())
    bar = spec.goodput.attainment_pct if spec.goodput is not None else 90.0
    axes[0][2].axhline(bar, color="#555555", ls="--", lw=1)
    axes[0][2].set_ylim(0, 101)
    axes[1][0].set_ylim(0, max([1.0, *(r["rejected_pct"] or 0.0 for r in rows)]) * 1.1)
    axes[1][1].set_ylim(0, 1)
    axes[0][2].legend(fontsize=8, loc="lower left")

    bars = axes[1][2]
    ys = list(range(len(policies)))[::-1]
    goodput = {p: float(mine[p][0]["goodput_rps"] or 0.0) for p in policies}
    values = [goodput[p] for p in policies]
    halves = []
    for p in policies:
        low, high = mine[p][0]["goodput_rps_ci_low"], mine[p][0]["goodput_rps_ci_high"]
        halves.append(0.0 if low is None or high is None else (high - low) / 2.0)
    bars.barh(
        ys,
        values,
        xerr=halves,
        capsize=3,
        color=[f"C{i}" for i in range(len(policies))],
        alpha=0.85,
    )
    names = [p + (" (default)" if p == options.default else "") for p in policies]
    bars.set_yticks(ys, names, fontsize=8.5)
    for y, policy, value in zip(ys, policies, values, strict=True):
        lowest = mine[policy][0]  # the lowest rate tried
        text = f"{value:.1f}"
        if lowest["goodput_bound"] == "above":
            text = f">={value:.1f}"  # no rate tried missed the bar
        elif lowest["goodput_bound"] == "below":
            text = f"<{lowest['offered_rps'] or 0.0:.1f}"  # even the lowest rate missed it
        setting = advice.index_of({"case": policy})
        paired = None if setting is None else advice.difference(setting, "goodput_rps")
        if paired is not None and not math.isnan(paired.low):
            text += f"  d{paired.mean:+.1f} [{paired.low:+.1f}, {paired.high:+.1f}]"
        bars.annotate(
            text, (value, y), xytext=(9, 0), textcoords="offset points", va="center", fontsize=8
        )
        if policy == chosen:
            bars.plot([value], [y], "o", ms=13, mfc="none", mec="#e41a1c", mew=2)
    bars.set_xlabel("goodput (req/s with >= 90% on time)", fontsize=8.5)
    bars.set_title("goodput (DistServe) per policy; red ring: recommended", fontsize=9.5)
    bars.grid(True, axis="x", alpha=0.3)
    bars.set_xlim(0, max([*(v + h for v, h in zip(values, halves, strict=True)), 1e-9]) * 1.6)

    first = result.plan.tasks[0].scenario if result.plan.tasks else {}
    sim = first.get("sim", {})
    fig.suptitle(
        f"{spec.sweep.name}: routing policies across offered load ({_workload_title(result)}), "
        f"SLO TTFT {sim.get('slo_ttft_s', 2.0):g} s / TPOT {sim.get('slo_tpot_s', 0.1):g} s\n"
        f"Recommended: {chosen or 'none (no policy is distinguishable from the baseline)'}; "
        f"shipped default: {options.default}",
        fontsize=10.5,
    )
    confidence = spec.tuning.confidence
    rule = (
        f"Recommendation (recommendation.json): a policy is recommended only if better than the "
        f"baseline on {advice.metrics[0].name} by a {confidence:.0%} simultaneous paired t "
        f"interval and not worse on {', '.join(m.name for m in advice.metrics[1:])}. Verdict: "
        f"{advice.reason}. Lines: means over replicates at each rate; goodput bars: "
        f"{confidence:.0%} t interval of the per-replicate crossings; d [low, high]: the "
        "difference from the baseline with its simultaneous paired interval (the one that "
        "decides). " + _case_note(result)
    )
    add_footer(fig, result, width=190, lead=(rule,), line_height=0.022, top=0.93)
    fields = ["policy", "rate_multiplier", *CURVE_METRICS]
    fields += ["goodput_rps", "goodput_rps_ci_low", "goodput_rps_ci_high", "goodput_bound"]
    fields += ["default", "recommended"]
    return save_figure(fig, out, "routing", fields, rows)
