"""The ``diffuse`` recipe: success and goodput against where the faults are, per recovery setting.

Rule kept here: the figure draws the sweep's one recommendation
(:mod:`narwhal.experiments.recommendation`): a setting is one value of ``lines`` with one of
``panels`` (by default ``recovery.max_ejection_percent`` and
``recovery.failure_quarantine_s``), judged by its worst case over the cases in each replicate,
since an operator does not know in advance whether the next incident is one dead engine or every
engine a little flaky, and recommended only when better than the baseline at the stated
confidence and not worse on a guard. Goodput here is the rate of requests that succeeded on time
(DistServe's SLO: ``first_byte_s <= slo_ttft_s`` and TPOT ``<= slo_tpot_s``) at the scenario's
one offered rate: DistServe's goodput, the highest rate with 90% on time, is zero for every
setting once faults fail a tenth of the requests, so it could not rank them. The shipped
defaults (the core's :class:`~narwhal.core.config.RecoverySettings` and
:class:`~narwhal.core.config.EngineSettings`) are marked beside the recommendation, so the
figure says whether they agree.

Theory of operation: the cases are the x axis, in the spec's order (from faults concentrated on
whole engines to faults spread thin over all of them); the top row is success, the bottom row
goodput, one column per ``panels`` value and one line per ``lines`` value (error bars: the
Student t interval of the mean over replicates at ``[tuning] confidence``, ``*_ci_half`` in the
CSV). The default line is drawn thicker, the recommended setting's points are
ringed in red. ``diffuse.csv`` has one row per (case, setting) with the plotted numbers, the
mean 503s (``errors.no_engine``), ejections and retried requests, the setting's worst case and
the recommendation and default flags.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.core.config import EngineSettings, RecoverySettings
from narwhal.experiments.figures.base import add_footer, pyplot, save_figure, short
from narwhal.experiments.recipes import DiffuseOptions
from narwhal.experiments.recommendation import recommend
from narwhal.experiments.stats import mean_interval

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult
    from narwhal.experiments.spec_model import SweepSpec

MARKERS = "osD^vP*X"
NO_ENGINE = "errors.no_engine"  # the 503s: no engine of a role left to place on
_SHIPPED = {"recovery": RecoverySettings(), "engine": EngineSettings()}


def shipped_default(key: str) -> Any:
    """The core's default for a router setting (``recovery.x``, ``engine.x``), else None."""
    section, _, name = key.partition(".")
    settings = _SHIPPED.get(section)
    return getattr(settings, name, None) if settings is not None else None


def case_note(spec: SweepSpec) -> str:
    """Each case's faults in a few words (``all 25%: inband_error on 4 decode p=0.25, ...``)."""
    parts = []
    for case in spec.cases:
        faults = case.set.get("faults", [])
        told = [
            f"{f.get('kind')} on {f.get('engine') or f.get('count', 1)} {f.get('role', '')} "
            f"p={f.get('probability', 1.0):g}".replace("  ", " ")
            for f in faults
            if isinstance(f, dict)
        ]
        parts.append(f"{case.label}: {', '.join(told) or 'the scenario faults'}")
    return "; ".join(parts) + "."


def _sd(values: list[float]) -> float | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _half_width(values: list[Any], confidence: float) -> float | None:
    """Half the Student t interval of the mean over replicates (None with fewer than 2)."""
    interval = mean_interval(values, confidence)
    return None if math.isnan(interval.low) else interval.half_width


def draw(result: SweepResult, options: DiffuseOptions, out: Path) -> list[Path]:
    plt = pyplot()
    from matplotlib.lines import Line2D

    spec = result.spec
    lines, panels = spec.grid[options.lines], spec.grid[options.panels]
    cases = [case.label for case in spec.cases]
    settings = [(line, panel) for panel in panels for line in lines]
    by_key: dict[tuple[Any, Any, str], dict[str, Any]] = {}
    for point, row in zip(result.plan.points, result.points, strict=True):
        params = point.params
        by_key[(params[options.lines], params[options.panels], params["case"])] = row
    goodputs_of_runs: dict[int, list[float]] = defaultdict(list)
    successes_of_runs: dict[int, list[float]] = defaultdict(list)
    for run in result.runs:
        goodputs_of_runs[run["point"]].append(run["on_time_rps"] or 0.0)
        successes_of_runs[run["point"]].append(run["success_pct"] or 0.0)
    confidence = spec.tuning.confidence

    success = {s: [by_key[(*s, c)]["success_pct"] or 0.0 for c in cases] for s in settings}
    advice = recommend(result)
    chosen: tuple[Any, Any] | None = None
    if advice.recommended_index is not None:
        picked = advice.settings[advice.recommended_index]
        chosen = (picked[options.lines], picked[options.panels])
    default = (shipped_default(options.lines), shipped_default(options.panels))

    rows: list[dict[str, Any]] = []
    for setting in settings:
        for case in cases:
            row = by_key[(*setting, case)]
            rows.append(
                {
                    "case": case,
                    options.lines: setting[0],
                    options.panels: setting[1],
                    "success_pct": row["success_pct"],
                    "success_pct_sd": row["success_pct_sd"],
                    "goodput_rps": row["on_time_rps"],
                    "goodput_rps_sd": _sd(goodputs_of_runs[row["point"]]),
                    "success_pct_ci_half": _half_width(successes_of_runs[row["point"]], confidence),
                    "goodput_rps_ci_half": _half_width(goodputs_of_runs[row["point"]], confidence),
                    "slo_attainment_pct": row["slo_attainment_pct"],
                    "offered_rps": row["offered_rps"],
                    "no_engine_503s": row.get(NO_ENGINE) or 0.0,
                    "ejections": row["ejections"],
                    "retried_requests": row["retried_requests"],
                    "worst_case_success_pct": min(success[setting]),
                    "recommended": setting == chosen,
                    "default": setting == default,
                }
            )

    fig, axes = plt.subplots(
        2, len(panels), figsize=(1.2 + 4.4 * len(panels), 8.6), squeeze=False, sharey="row"
    )
    xs = list(range(len(cases)))
    colours = plt.get_cmap("viridis")
    for column, panel in enumerate(panels):
        for metric, ax in (("success_pct", axes[0][column]), ("goodput_rps", axes[1][column])):
            for index, line in enumerate(lines):
                mine = [r for r in rows if r[options.lines] == line and r[options.panels] == panel]
                ys = [r[metric] or 0.0 for r in mine]
                spread = [r[f"{metric}_ci_half"] or 0.0 for r in mine]
                is_default = line == default[0]
                label = f"{short(options.lines)} = {line}" + (" (default)" if is_default else "")
                ax.errorbar(
                    xs,
                    ys,
                    yerr=spread,
                    marker=MARKERS[index % len(MARKERS)],
                    lw=2.6 if is_default else 1.3,
                    ms=5,
                    capsize=2,
                    color=colours(index / max(1, len(lines) - 1) * 0.9),
                    label=label,
                )
                if (line, panel) == chosen:
                    ax.plot(xs, ys, "o", ms=13, mfc="none", mec="#e41a1c", mew=2)
            ax.set_xticks(xs, [textwrap.fill(c, 10) for c in cases], fontsize=8)
            ax.grid(True, alpha=0.3)
        title = f"{short(options.panels)} = {panel}"
        if panel == default[1]:
            title += " (default)"
        axes[0][column].set_title(title, fontsize=10)
    axes[0][0].set_ylabel("success rate (%)")
    axes[1][0].set_ylabel("goodput (requests on time per second)")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    ring = Line2D([], [], ls="none", marker="o", ms=13, mfc="none", mec="#e41a1c", mew=2)
    axes[0][-1].legend([*handles, ring], [*labels, "recommended"], fontsize=8, loc="lower left")
    offered = rows[0]["offered_rps"] or 0.0
    verdict = "No recommendation"
    if chosen is not None:
        verdict = (
            f"Recommended (red rings): {short(options.lines)}={chosen[0]}, "
            f"{short(options.panels)}={chosen[1]}"
        )
    fig.suptitle(
        f"{spec.sweep.name}: success and goodput against where the faults are (~{offered:.0f} "
        f"req/s offered)\n{verdict}; default: {short(options.lines)}={default[0]}, "
        f"{short(options.panels)}={default[1]}",
        fontsize=10.5,
    )
    rule = (
        f"Recommendation (recommendation.json): a setting is judged by its worst case over the "
        f"cases in each replicate, against the baseline setting, by a {confidence:.0%} "
        "simultaneous paired t interval; recommended only if better on "
        f"{advice.metrics[0].name} and not worse on "
        f"{', '.join(m.name for m in advice.metrics[1:])}. Verdict: {advice.reason}. "
        "Goodput: requests that succeeded within the SLO (TTFT and TPOT) per second, at the one "
        f"offered rate. Points: mean with its {confidence:.0%} t interval over replicates. "
        "Each case replaces the scenario's faults: " + case_note(spec)
    )
    add_footer(fig, result, width=170, lead=(rule,), line_height=0.022, top=0.93)
    fields = [
        "case",
        options.lines,
        options.panels,
        *[k for k in rows[0] if k not in ("case", options.lines, options.panels)],
    ]
    return save_figure(fig, out, "diffuse", fields, rows)
