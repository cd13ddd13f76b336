"""The ``flow`` recipe: flow control against plain admission, per workload class, across offered
load.

Rule kept here: every number drawn is a mean over replicates with its Student t interval at
``[tuning] confidence`` (from :func:`narwhal.experiments.aggregate.point_rows`'s
``class.<name>.<metric>`` columns); with ``seed_by = "replicate"`` both arms of one replicate
see the same arrivals, so the lines differ by the admission setting alone. A class is judged by
its own TTFT objective (:mod:`narwhal.sim.classes`); a request flow control refuses is never on
time.

Theory of operation: each ``[[cases]]`` entry is one admission setting (``figure.baseline``
leaves flow control off), crossed with the load axis ``figure.x``. One column of panels per
workload class: SLO attainment (the 90% bar dashed), TTFT p90 of its succeeded requests
(``first_byte_s``, log scale) and its goodput (on-time requests per second), each against the
load, one line per case with its interval as error bars. ``flow.csv`` has one row per (case,
load, class) with every class metric's mean and interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.experiments.figures.base import add_footer, pyplot, save_figure, short
from narwhal.experiments.recipes import FlowOptions
from narwhal.experiments.worker import CLASS_FIELDS, CLASS_PREFIX

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult

MARKERS = "osD^vP*X"
PANELS = (
    ("slo_attainment_pct", "SLO attainment (% on time)"),
    ("first_byte_p90_s", "TTFT p90 (first_byte_s, s)"),
    ("on_time_rps", "goodput (on-time req/s)"),
)
CSV_FIELDS = ["case", "load", "class"] + [
    f"{key}{end}" for key in CLASS_FIELDS for end in ("", "_ci_low", "_ci_high")
]


def class_names(result: SweepResult) -> list[str]:
    """The workload classes the runs report, in the scenario's order."""
    names: dict[str, None] = {}
    for field in result.point_fields:
        if field.startswith(CLASS_PREFIX) and field.endswith(".requests"):
            names.setdefault(field[len(CLASS_PREFIX) : -len(".requests")], None)
    return list(names)


def class_rows(result: SweepResult, options: FlowOptions) -> list[dict[str, Any]]:
    """One row per (case, load, class): each class metric's mean and interval."""
    rows = []
    for point in result.points:
        for name in class_names(result):
            row: dict[str, Any] = {"case": point["case"], "load": point[options.x], "class": name}
            for key in CLASS_FIELDS:
                column = f"{CLASS_PREFIX}{name}.{key}"
                for end in ("", "_ci_low", "_ci_high"):
                    row[f"{key}{end}"] = point.get(f"{column}{end}")
            rows.append(row)
    return rows


def _bars(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[list[float]]]:
    """Means and their (clipped) interval half-widths, for error bars."""
    means = [float(r[key]) if r[key] is not None else float("nan") for r in rows]
    below, above = [], []
    for mean, row in zip(means, rows, strict=True):
        low, high = row[f"{key}_ci_low"], row[f"{key}_ci_high"]
        if key.endswith("_pct"):
            low = None if low is None else max(0.0, low)
            high = None if high is None else min(100.0, high)
        below.append(max(0.0, mean - low) if low is not None else 0.0)
        above.append(max(0.0, high - mean) if high is not None else 0.0)
    return means, [below, above]


def draw(result: SweepResult, options: FlowOptions, out: Path) -> list[Path]:
    names = class_names(result)
    if not names:
        raise ValueError(
            "the flow recipe draws workload classes; the scenario has no [[workload.classes]]"
        )
    plt = pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    rows = class_rows(result, options)
    cases = [case.label for case in result.spec.cases]
    fig, axes = plt.subplots(
        len(PANELS), len(names), figsize=(4.4 * len(names), 9.4), squeeze=False
    )
    for column, name in enumerate(names):
        for index, case in enumerate(cases):
            mine = sorted(
                (r for r in rows if r["class"] == name and r["case"] == case),
                key=lambda r: float(r["load"]),
            )
            xs = [float(r["load"]) for r in mine]
            for panel, (key, _) in enumerate(PANELS):
                means, errors = _bars(mine, key)
                axes[panel][column].errorbar(
                    [x * (1 + 0.015 * index) for x in xs],  # side by side, not on top
                    means,
                    yerr=errors,
                    marker=MARKERS[index % len(MARKERS)],
                    ms=4,
                    lw=2.2 if case != options.baseline else 1.4,
                    capsize=2.5,
                    color=f"C{index}",
                    label=case,
                )
        for panel, (_, title) in enumerate(PANELS):
            ax = axes[panel][column]
            ax.set_title(f"{name}: {title}", fontsize=9.5)
            ax.set_xlabel(f"offered load ({short(options.x)})", fontsize=8.5)
            ax.grid(True, alpha=0.3)
        axes[0][column].axhline(90.0, color="#555555", ls="--", lw=1)
        axes[0][column].set_ylim(-2, 102)
        ttft = axes[1][column]
        ttft.set_yscale("log")
        ttft.yaxis.set_major_formatter(ScalarFormatter())
        ttft.yaxis.set_minor_formatter(NullFormatter())
        axes[2][column].set_ylim(bottom=0)
    axes[0][0].legend(fontsize=8, loc="lower left")
    confidence = result.spec.tuning.confidence
    replicates = result.spec.sweep.replicates
    lead = (
        f"Means over {replicates} replicate(s), error bars the {confidence:.0%} t interval; "
        "each class judged by its own TTFT objective; a request flow control sheds is never "
        f"on time. Baseline: {options.baseline}.",
    )
    fig.suptitle(f"{result.spec.sweep.description or result.spec.sweep.name}", fontsize=11)
    add_footer(fig, result, width=190, lead=lead, top=0.95)
    return save_figure(fig, out, "flow", CSV_FIELDS, rows)
