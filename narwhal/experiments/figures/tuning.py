"""The ``tuning`` recipe: two recovery settings as a grid of heatmaps, the recommended cell marked.

Rule kept here (the recommendation), in three steps: (1) keep the cells whose goodput is within
``goodput_tolerance_pct`` percent of the best cell's (a setting must not cost capacity);
(2) of those, keep the cells whose mean success rate is within ``success_tolerance_pp``
percentage points of the best of them; (3) pick the lowest p99 ``first_byte_s``, then the
higher goodput, then grid order. Success and p99 are read at the reference rate
(``[goodput].report_at``); goodput is DistServe's (the highest rate with >= 90% of requests on
time, :mod:`narwhal.experiments.aggregate`). Without ``[goodput]`` step (1) is skipped and the
third panel is SLO attainment at the sweep's one rate, and the figure says so. The tolerances
are there because differences smaller than the spread between replicates are noise.

Theory of operation: the spec's grid must have exactly the two axes ``x`` and ``y`` (and no
cases). Each panel is an ``imshow`` of point means with the value printed in every cell; all
colour maps run from worse (dark) to better (bright), so p99 uses the reversed map.
``tuning.csv`` holds one row per cell with the plotted numbers, the lowest rate its goodput
curve tried (the bound of a goodput below it) and the recommendation flag.
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

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult


def recommend(cells: list[dict[str, Any]], goodput_pct: float, success_pp: float) -> int | None:
    """Index of the recommended cell (see the module's rule); None when every cell measured
    the same, where any pick would only be grid order dressed up as advice."""
    measured = {(c["success_pct"], c["first_byte_p99_s"], c.get("goodput_rps")) for c in cells}
    if len(measured) <= 1:
        return None
    candidates = list(range(len(cells)))
    goodputs = [c.get("goodput_rps") for c in cells]
    if any(g is not None for g in goodputs):
        best_goodput = max(g or 0.0 for g in goodputs)
        floor = best_goodput * (1.0 - goodput_pct / 100.0)
        candidates = [i for i in candidates if (goodputs[i] or 0.0) >= floor - 1e-9]
    best = max(cells[i]["success_pct"] or 0.0 for i in candidates)
    candidates = [i for i in candidates if (cells[i]["success_pct"] or 0.0) >= best - success_pp]

    def key(i: int) -> tuple[float, float, int]:
        p99 = cells[i]["first_byte_p99_s"]
        return (math.inf if p99 is None else p99, -(cells[i].get("goodput_rps") or 0.0), i)

    return min(candidates, key=key)


def _panel(
    ax: Any,
    grid: list[list[float]],
    xs: list[Any],
    ys: list[Any],
    spec: dict[str, Any],
    labels: list[list[str | None]] | None = None,
    spread: list[list[float]] | None = None,
) -> None:
    plt = pyplot()
    finite = [v for row in grid for v in row if not math.isnan(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if high - low < 1e-12:
        low, high = low - 1.0, high + 1.0
    image = ax.imshow(grid, origin="lower", cmap=spec["cmap"], vmin=low, vmax=high, aspect="auto")
    plt.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
    for j, row in enumerate(grid):
        for i, value in enumerate(row):
            text = "-" if math.isnan(value) else spec["fmt"].format(value)
            label = None if labels is None else labels[j][i]
            if label is not None:
                text = label
            if spread is not None and not math.isnan(spread[j][i]):
                text += "\n\u00b1" + spec["fmt"].format(spread[j][i])
            shade = 0.0 if math.isnan(value) else (value - low) / (high - low)
            bright = shade > 0.55 if not spec["cmap"].endswith("_r") else shade < 0.45
            ax.text(
                i,
                j,
                text,
                ha="center",
                va="center",
                fontsize=8.5,
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


def draw(result: SweepResult, options: TuningOptions, out: Path) -> list[Path]:
    plt = pyplot()
    from matplotlib.patches import Rectangle

    spec = result.spec
    xs, ys = spec.grid[options.x], spec.grid[options.y]
    cells = []
    for point in result.points:
        cells.append(
            {
                options.x: point[options.x],
                options.y: point[options.y],
                "success_pct": point["success_pct"],
                "success_pct_sd": point["success_pct_sd"],
                "first_byte_p99_s": point["first_byte_p99_s"],
                "first_byte_p99_s_sd": point["first_byte_p99_s_sd"],
                "slo_attainment_pct": point["slo_attainment_pct"],
                "goodput_rps": point.get("goodput_rps"),
                "goodput_rps_sd": point.get("goodput_rps_sd"),
                "goodput_bound": point.get("goodput_bound"),
                "lowest_offered_rps": lowest_rate(result.runs, point["point"]),
                "offered_rps": point["offered_rps"],
                "ejections": point["ejections"],
                "retried_requests": point["retried_requests"],
            }
        )
    chosen = recommend(cells, options.goodput_tolerance_pct, options.success_tolerance_pp)
    for i, cell in enumerate(cells):
        cell["recommended"] = i == chosen

    def matrix(key: str, scale: float = 1.0) -> list[list[float]]:
        grid = [[math.nan] * len(xs) for _ in ys]
        for cell in cells:
            value = cell[key]
            grid[ys.index(cell[options.y])][xs.index(cell[options.x])] = (
                math.nan if value is None else value * scale
            )
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
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.9))
    labels: list[list[str | None]] = [[None] * len(xs) for _ in ys]
    for cell in cells:
        label = goodput_label(
            cell["goodput_rps"], cell["goodput_bound"], cell["lowest_offered_rps"]
        )
        labels[ys.index(cell[options.y])][xs.index(cell[options.x])] = label
    for ax, (key, scale, style) in zip(axes, panels, strict=True):
        sd = matrix(f"{key}_sd", scale) if f"{key}_sd" in cells[0] else None
        _panel(ax, matrix(key, scale), xs, ys, style, labels if key == "goodput_rps" else None, sd)
        if chosen is not None:
            cx, cy = xs.index(cells[chosen][options.x]), ys.index(cells[chosen][options.y])
            ax.add_patch(Rectangle((cx - 0.5, cy - 0.5), 1, 1, fill=False, lw=2.5, ec="#e41a1c"))
        ax.set_xlabel(options.x)
    axes[0].set_ylabel(options.y)
    rate = ""
    if goodput is not None:
        offered = cells[0 if chosen is None else chosen]["offered_rps"]
        rate = f" at rate x{goodput.reference():g} (~{offered:.0f} req/s offered)"
    verdict = "no recommendation: every cell measured the same"
    if chosen is not None:
        verdict = (
            f"Recommended (red box): {short(options.x)}={cells[chosen][options.x]}, "
            f"{short(options.y)}={cells[chosen][options.y]}"
        )
    fig.suptitle(
        f"{spec.sweep.name}: {short(options.x)} x {short(options.y)}; success and p99{rate}. "
        + verdict,
        fontsize=11,
    )
    keep = (
        f"goodput within {options.goodput_tolerance_pct:g}% of the best; of those "
        if goodput is not None
        else ""
    )
    rule = (
        f"Rule: {keep}success within {options.success_tolerance_pp:g} pp of the best; then the "
        "lowest p99 first_byte_s (then higher goodput). Cells show mean +- sd over replicates. "
        + (
            "Goodput (DistServe): highest offered rate with >= 90% of requests on time "
            f"(SLO TTFT and TPOT), interpolated between rates x"
            f"{', x'.join(f'{m:g}' for m in goodput.rate_multipliers)} of the scenario's "
            "(>= : every rate met the bar; < : none did)."
            if goodput is not None
            else "Third panel: SLO attainment at the one rate swept (goodput not computed)."
        )
    )
    add_footer(fig, result, width=190, lead=(rule,), line_height=0.028, top=0.94)
    fields = [options.x, options.y, *[k for k in cells[0] if k not in (options.x, options.y)]]
    return save_figure(fig, out, "tuning", fields, cells)
