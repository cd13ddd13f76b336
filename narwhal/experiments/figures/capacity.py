"""The ``capacity`` recipe: goodput against fleet size, one line per prefill:decode ratio.

Rule kept here: goodput and SLO attainment are DistServe's (Zhong et al., OSDI 2024; a request is on
time when it succeeded with ``first_byte_s <= slo_ttft_s`` and TPOT ``<= slo_tpot_s``;
goodput is the highest rate with >= 90% on time), computed per replicate from the point's rate
curve by :func:`narwhal.experiments.aggregate.goodput` and averaged. The faults stay on while
the rate rises, so the figure answers "how much load does this fleet carry *at this fault
rate*".

Theory of operation: the spec's grid has the ``size`` and ``ratio`` axes (by default the
derived keys ``fleet.size`` and ``fleet.pd_ratio``) and a ``[goodput]`` rate axis. The left
panel draws each ratio's goodput against fleet size (error bars: the half-width of the Student t
interval, at ``[tuning] confidence``, of the mean per-replicate goodput crossing,
labels: goodput per engine, pushed apart so they never overprint; a point whose goodput lies
below the lowest rate tried is an open downward triangle at that rate, its upper bound). The
right panel shows where those numbers come from: attainment
against offered load per engine for every ratio at the largest fleet, with the 90% bar.
``capacity.csv`` has one row per (size, ratio, rate) with the mean attainment and the point's
goodput with that interval (``goodput_rps_ci_low``, ``goodput_rps_ci_high``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.experiments.figures.base import (
    add_footer,
    pyplot,
    save_figure,
    short,
)
from narwhal.experiments.recipes import CapacityOptions

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult

MARKERS = "osD^vP*X"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _half_width(point: dict[str, Any]) -> float:
    """Half the goodput interval's width (0 where there is none: fewer than 2 replicates)."""
    low, high = point.get("goodput_rps_ci_low"), point.get("goodput_rps_ci_high")
    return 0.0 if low is None or high is None else (high - low) / 2.0


def _step(sizes: list[Any]) -> float:
    return (sizes[-1] - sizes[0]) / max(len(sizes) - 1, 1) or 1.0


def _place_labels(
    axes: Any, labels: list[tuple[float, float, str, int]], gap_pt: float = 9.0
) -> None:
    """Each point's label to its right, the labels at one fleet size pushed apart vertically
    (at least ``gap_pt`` points) so they never overprint, each as near its point as it can be."""
    axes.figure.canvas.draw()  # the limits are final: data -> points is now known
    to_pt = 72.0 / axes.figure.dpi
    by_x: dict[float, list[tuple[float, float, str, int]]] = defaultdict(list)
    for label in labels:
        by_x[label[0]].append(label)
    for column in by_x.values():
        column.sort(key=lambda label: label[1])
        last = -math.inf
        for x, y, text, r in column:
            at = axes.transData.transform((x, y))[1] * to_pt
            placed = max(at, last + gap_pt)
            last = placed
            axes.annotate(
                text,
                (x, y),
                fontsize=6.5,
                xytext=(7, placed - at - 2),
                textcoords="offset points",
                color=f"C{r}",
                bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.85},
            )


def draw(result: SweepResult, options: CapacityOptions, out: Path) -> list[Path]:
    plt = pyplot()
    spec = result.spec
    sizes, ratios = spec.grid[options.size], spec.grid[options.ratio]
    points = {p["point"]: p for p in result.points}
    curves: dict[int, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in result.runs:
        curves[run["point"]][run["rate_multiplier"]].append(run)
    rows: list[dict[str, Any]] = []
    for point in result.plan.points:
        summary = points[point.index]
        engines = summary["engines"] or 1
        for multiplier, runs in sorted(curves[point.index].items()):
            offered = _mean([r["offered_rps"] or 0.0 for r in runs])
            rows.append(
                {
                    "fleet_size": point.params[options.size],
                    "pd_ratio": point.params[options.ratio],
                    "prefill": summary["prefill"],
                    "decode": summary["decode"],
                    "rate_multiplier": multiplier,
                    "offered_rps": offered,
                    "offered_rps_per_engine": offered / engines,
                    "slo_attainment_pct": _mean([r["slo_attainment_pct"] for r in runs]),
                    "success_pct": _mean([r["success_pct"] for r in runs]),
                    "goodput_rps": summary["goodput_rps"],
                    "goodput_rps_sd": summary["goodput_rps_sd"],
                    "goodput_rps_ci_low": summary.get("goodput_rps_ci_low"),
                    "goodput_rps_ci_high": summary.get("goodput_rps_ci_high"),
                    "goodput_per_engine": summary["goodput_per_engine"],
                    "goodput_bound": summary["goodput_bound"],
                }
            )

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.3))
    labels: list[tuple[float, float, str, int]] = []  # (x, y, text, ratio index)
    for r, ratio in enumerate(ratios):
        mine = [p for p in result.points if p[options.ratio] == ratio]
        mine.sort(key=lambda p: sizes.index(p[options.size]))
        xs = [p[options.size] for p in mine]
        ys = [p["goodput_rps"] or 0.0 for p in mine]
        below = [p["goodput_bound"] == "below" for p in mine]
        spread = [_half_width(p) for p in mine]
        errors = [[min(s, y) for s, y in zip(spread, ys, strict=True)], spread]  # not below 0
        marker = MARKERS[r % len(MARKERS)]
        known = [math.nan if b else y for y, b in zip(ys, below, strict=True)]
        left.errorbar(
            xs, known, yerr=errors, marker=marker, capsize=3, lw=1.6, label=f"P:D = {ratio}"
        )
        for p, x, y, is_below in zip(mine, xs, ys, below, strict=True):
            per = p["goodput_per_engine"] or 0.0
            text = f"{per:.1f}/eng"
            if p["goodput_bound"] == "above":
                text = f">={per:.1f}/eng"
            elif is_below:
                # goodput is somewhere under the lowest rate tried: drawn at that rate (an
                # upper bound, open downward triangle), never at 0, and not joined to the line
                tried = [row for row in rows if row["fleet_size"] == x and row["pd_ratio"] == ratio]
                lowest = min(tried, key=lambda row: row["offered_rps"])
                y = lowest["offered_rps"]
                left.plot([x], [y], marker="v", ms=8, mfc="none", color=f"C{r}", ls="none")
                text = f"<{lowest['offered_rps_per_engine']:.1f}/eng"
            labels.append((x, y, f"{text} ({p['prefill']}P+{p['decode']}D)", r))
    left.set_xlim(sizes[0] - 0.6 * _step(sizes), sizes[-1] + 1.4 * _step(sizes))  # label room
    left.set_ylim(bottom=0)
    left.set_xlabel(f"fleet size ({short(options.size)}: engines; labels: goodput per engine)")
    left.set_ylabel("goodput (req/s with >= 90% of requests on time)")
    left.set_xticks(sizes)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8.5)
    left.set_title("goodput (DistServe) by fleet size and prefill:decode ratio", fontsize=10)

    largest = sizes[-1]
    for r, ratio in enumerate(ratios):
        mine = [row for row in rows if row["fleet_size"] == largest and row["pd_ratio"] == ratio]
        right.plot(
            [row["offered_rps_per_engine"] for row in mine],
            [row["slo_attainment_pct"] for row in mine],
            marker=MARKERS[r % len(MARKERS)],
            lw=1.6,
            label=f"P:D = {ratio}",
        )
    goodput = spec.goodput
    bar = goodput.attainment_pct if goodput is not None else 90.0
    right.axhline(bar, color="#555555", ls="--", lw=1)
    right.text(right.get_xlim()[0], bar, f" {bar:g}% bar", va="bottom", fontsize=8)
    right.set_xlabel("offered load (req/s per engine)")
    right.set_ylabel("SLO attainment (% of requests on time)")
    right.set_ylim(0, 101)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8.5)
    right.set_title(f"SLO attainment vs load, {largest} engines", fontsize=10)

    first = result.plan.tasks[0].scenario if result.plan.tasks else {}
    sim, fleet = first.get("sim", {}), first.get("fleet", {})
    fig.suptitle(
        f"{spec.sweep.name}: capacity of {fleet.get('model', 'llama3-8b')} engines on the Azure "
        f"conversation trace, SLO TTFT {sim.get('slo_ttft_s', 2.0):g} s / "
        f"TPOT {sim.get('slo_tpot_s', 0.1):g} s, with faults",
        fontsize=11,
    )
    confidence = spec.tuning.confidence
    note = (
        f"Error bars: {confidence:.0%} Student t interval of the mean of the per-replicate "
        "goodput crossings (half-width, drawn about the goodput of the mean curve)."
    )
    add_footer(fig, result, width=185, lead=(note,))
    _place_labels(left, labels)  # after the layout is final
    return save_figure(fig, out, "capacity", list(rows[0]) if rows else ["fleet_size"], rows)
