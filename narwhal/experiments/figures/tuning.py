"""The ``tuning`` recipe: two recovery settings as a grid of heatmaps, the recommended cell marked.

Rule kept here: the figure shows the sweep's one recommendation
(:mod:`narwhal.experiments.recommendation`: better than the baseline on the primary metric at
the stated confidence and not worse on success or p99 ``first_byte_s``), never a pick of its
own; every cell shows its difference from the baseline with that interval, and no colour scale
is stretched so that a difference inside its interval looks like a different colour (the range
is at least twice the widest interval). Success and p99 are read at the reference rate
(``[goodput].report_at``); goodput is DistServe's (the highest rate with >= 90% of requests on
time, :mod:`narwhal.experiments.aggregate`). Without ``[goodput]`` the third panel is SLO
attainment at the sweep's one rate, and the figure says so.

Theory of operation: the spec's grid must have exactly the two axes ``x`` and ``y`` (and no
cases). Each panel is an ``imshow`` of point means with the value and the difference from the
baseline printed in every cell; all colour maps run from worse (dark) to better (bright), so p99
uses the reversed map. ``tuning.csv`` holds one row per cell with the plotted numbers, each
metric's difference from the baseline and its interval (``*_vs_baseline``, ``_low``,
``_high``), the cell's own t interval (``*_ci_low``, ``*_ci_high``), the lowest rate its goodput
curve tried (the bound of a goodput below it) and the baseline and recommendation flags.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.experiments.aggregate import mean_curve
from narwhal.experiments.figures.base import (
    add_footer,
    pyplot,
    save_figure,
    short,
)
from narwhal.experiments.recipes import TuningOptions
from narwhal.experiments.recommendation import recommend
from narwhal.experiments.stats import Interval

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult


def colour_range(values: list[float], half_widths: list[float]) -> tuple[float, float]:
    """The colour map's (low, high): the values' range, widened about its middle to at least
    twice the widest interval (4 half-widths), so a difference inside its interval never spans
    more than a quarter of the palette."""
    finite = [v for v in values if not math.isnan(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    widest = max((h for h in half_widths if not math.isnan(h)), default=0.0)
    span = max(high - low, 4.0 * widest)
    if span < 1e-12:
        span = 2.0
    middle = (low + high) / 2.0
    return middle - span / 2.0, middle + span / 2.0


def _panel(
    ax: Any,
    grid: list[list[float]],
    xs: list[Any],
    ys: list[Any],
    spec: dict[str, Any],
    labels: list[list[str | None]] | None = None,
    notes: list[list[str | None]] | None = None,
    half_widths: list[float] | None = None,
) -> None:
    plt = pyplot()
    low, high = colour_range([v for row in grid for v in row], half_widths or [])
    image = ax.imshow(grid, origin="lower", cmap=spec["cmap"], vmin=low, vmax=high, aspect="auto")
    plt.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
    for j, row in enumerate(grid):
        for i, value in enumerate(row):
            text = "-" if math.isnan(value) else spec["fmt"].format(value)
            label = None if labels is None else labels[j][i]
            if label is not None:
                text = label
            note = None if notes is None else notes[j][i]
            if note:
                text += "\n" + note
            shade = 0.0 if math.isnan(value) else (value - low) / (high - low)
            bright = shade > 0.55 if not spec["cmap"].endswith("_r") else shade < 0.45
            ax.text(
                i,
                j,
                text,
                ha="center",
                va="center",
                fontsize=7.5,
                color="black" if bright else "white",
            )
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_title(spec["title"], fontsize=10)


def lowest_rate(runs: list[dict[str, Any]], point: int) -> float | None:
    """The lowest offered rate a point's goodput curve tried (its mean over replicates)."""
    curve = mean_curve([run for run in runs if run["point"] == point])
    return min((rate for rate, _ in curve), default=None)


def goodput_label(value: float | None, bound: str | None, lowest_rps: float | None) -> str | None:
    """A goodput cell's text when it is a bound, not a crossing: ``>=`` the highest rate tried
    (no rate missed the bar), ``<`` the lowest rate tried (even that one missed it); None for a
    measured crossing, shown as its value."""
    if bound == "above" and value is not None:
        return f">={value:.1f}"
    if bound == "below":
        return "<-" if lowest_rps is None else f"<{lowest_rps:.1f}"
    return None


PANEL_METRICS = ("success_pct", "first_byte_p99_s", "goodput_rps", "slo_attainment_pct")


def _difference_note(interval: Interval | None, fmt: str, scale: float) -> str | None:
    """A cell's difference from the baseline over its interval: ``d+0.31`` / ``[-0.10, +0.72]``."""
    if interval is None or math.isnan(interval.mean):
        return None
    if math.isnan(interval.low):
        return "d" + fmt.format(interval.mean * scale)
    return (
        f"d{fmt.format(interval.mean * scale)}\n"
        f"[{fmt.format(interval.low * scale)}, {fmt.format(interval.high * scale)}]"
    )


def draw(result: SweepResult, options: TuningOptions, out: Path) -> list[Path]:
    plt = pyplot()
    from matplotlib.patches import Rectangle

    spec = result.spec
    xs, ys = spec.grid[options.x], spec.grid[options.y]
    advice = recommend(result)
    chosen = advice.recommended_index
    intervals: dict[tuple[int, str], Interval] = {}
    cells = []
    for point in result.points:
        cell: dict[str, Any] = {
            options.x: point[options.x],
            options.y: point[options.y],
            "baseline": point["point"] == advice.baseline_index,
            "recommended": point["point"] == chosen,
        }
        for key in PANEL_METRICS:
            cell[key] = point.get(key)
            difference = advice.difference(point["point"], key)
            for end, value in (
                ("vs_baseline", None if difference is None else difference.mean),
                ("vs_baseline_low", None if difference is None else difference.low),
                ("vs_baseline_high", None if difference is None else difference.high),
            ):
                cell[f"{key}_{end}"] = None if value is None or math.isnan(value) else value
            if difference is not None:
                intervals[(point["point"], key)] = difference
            cell[f"{key}_ci_low"] = point.get(f"{key}_ci_low")
            cell[f"{key}_ci_high"] = point.get(f"{key}_ci_high")
        cell["goodput_bound"] = point.get("goodput_bound")
        cell["lowest_offered_rps"] = lowest_rate(result.runs, point["point"])
        cell["offered_rps"] = point["offered_rps"]
        cell["ejections"] = point["ejections"]
        cell["retried_requests"] = point["retried_requests"]
        cells.append(cell)

    def place(cell: dict[str, Any]) -> tuple[int, int]:
        return ys.index(cell[options.y]), xs.index(cell[options.x])

    def matrix(key: str, scale: float = 1.0) -> list[list[float]]:
        grid = [[math.nan] * len(xs) for _ in ys]
        for cell in cells:
            value = cell[key]
            j, i = place(cell)
            grid[j][i] = math.nan if value is None else value * scale
        return grid

    goodput = spec.goodput
    panels = [
        ("success_pct", 1.0, {"title": "success rate (%)", "cmap": "viridis", "fmt": "{:.2f}"}),
        (
            "first_byte_p99_s",
            1e3,
            {"title": "p99 first_byte_s (ms)", "cmap": "viridis_r", "fmt": "{:.0f}"},
        ),
    ]
    if goodput is not None:
        panels.append(
            (
                "goodput_rps",
                1.0,
                {"title": "goodput (req/s, >= 90% on time)", "cmap": "viridis", "fmt": "{:.1f}"},
            )
        )
    else:
        panels.append(
            (
                "slo_attainment_pct",
                1.0,
                {"title": "SLO attainment (%)", "cmap": "viridis", "fmt": "{:.1f}"},
            )
        )
    fig, axes = plt.subplots(1, 3, figsize=(15.0, 6.0))
    labels: list[list[str | None]] = [[None] * len(xs) for _ in ys]
    for cell in cells:
        j, i = place(cell)
        labels[j][i] = goodput_label(
            cell["goodput_rps"], cell["goodput_bound"], cell["lowest_offered_rps"]
        )
    for ax, (key, scale, style) in zip(axes, panels, strict=True):
        notes: list[list[str | None]] = [[None] * len(xs) for _ in ys]
        half_widths = []
        fmt = "{:+.2f}" if scale == 1.0 else "{:+.0f}"
        for cell, point in zip(cells, result.points, strict=True):
            j, i = place(cell)
            difference = intervals.get((point["point"], key))
            if cell["baseline"]:
                notes[j][i] = "baseline"
            else:
                notes[j][i] = _difference_note(difference, fmt, scale)
            if difference is not None and not math.isnan(difference.half_width):
                half_widths.append(difference.half_width * scale)
        _panel(
            ax,
            matrix(key, scale),
            xs,
            ys,
            style,
            labels if key == "goodput_rps" else None,
            notes,
            half_widths,
        )
        if advice.baseline_index is not None:
            base = next(c for c in cells if c["baseline"])
            by, bx = place(base)
            ax.add_patch(
                Rectangle((bx - 0.5, by - 0.5), 1, 1, fill=False, lw=1.5, ls="--", ec="#dddddd")
            )
        if chosen is not None:
            cy, cx = place(cells[chosen])
            ax.add_patch(Rectangle((cx - 0.5, cy - 0.5), 1, 1, fill=False, lw=2.5, ec="#e41a1c"))
        ax.set_xlabel(options.x)
    axes[0].set_ylabel(options.y)
    rate = ""
    if goodput is not None:
        offered = cells[0 if chosen is None else chosen]["offered_rps"]
        rate = f" at rate x{goodput.reference():g} (~{offered:.0f} req/s offered)"
    if chosen is not None:
        verdict = (
            f"Recommended (red box): {short(options.x)}={cells[chosen][options.x]}, "
            f"{short(options.y)}={cells[chosen][options.y]}"
        )
    else:
        verdict = "No recommendation"
    fig.suptitle(
        f"{spec.sweep.name}: {short(options.x)} x {short(options.y)}; success and p99{rate}. "
        + verdict,
        fontsize=11,
    )
    confidence = spec.tuning.confidence
    decision = advice.decision
    level = f" (each at {decision.per_cell_confidence:.2%})" if decision is not None else ""
    rule = (
        f"Cells: mean over replicates; d = difference from the baseline (dashed box) with its "
        f"{confidence:.0%} simultaneous interval{level}, "
        + ("paired t over replicates (common random numbers)" if advice.paired else "Welch t")
        + f". Recommended only if better on {advice.metrics[0].name} with that confidence and "
        f"not worse on {', '.join(m.name for m in advice.metrics[1:])}. Colour scales span at "
        "least twice the widest interval. Verdict: "
        + advice.reason
        + ". "
        + (
            "Goodput (DistServe): highest offered rate with >= 90% of requests on time "
            f"(SLO TTFT and TPOT), interpolated between rates x"
            f"{', x'.join(f'{m:g}' for m in goodput.rate_multipliers)} of the scenario's "
            "(>= : every rate met the bar; < : none did)."
            if goodput is not None
            else "Third panel: SLO attainment at the one rate swept (goodput not computed)."
        )
    )
    add_footer(fig, result, width=215, lead=(rule,), line_height=0.028, top=0.94)
    fields = [options.x, options.y, *[k for k in cells[0] if k not in (options.x, options.y)]]
    return save_figure(fig, out, "tuning", fields, cells)
