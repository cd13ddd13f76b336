"""The ``retries`` recipe: retry settings compared as CDFs of ``first_byte_s`` and error breakdowns.

Rule kept here: the CDF is over *all* requests, pooled over replicates: a request that failed
never got its first byte, so each curve levels off at that setting's success rate and the gap
to 1 is what the setting lost. The error breakdown is the mean share of requests (over
replicates) that ended in each error class (the core's fault kinds), stacked per setting, its
total labelled with the t interval over replicates (``[tuning] confidence``) of the share
failed (``failed_pct_ci_low``/``_high`` in ``retries_errors.csv``).

Theory of operation: each point (a case label, or the point's parameters) is one setting. The
workers return the sorted ``first_byte_s`` of every successful request
(``needs_samples``); pooled and divided by the total request count they give the CDF.
``retries_cdf.csv`` tabulates, per setting, the ``first_byte_s`` by which each fraction of all
requests had its first byte (empty past the success rate); ``retries_errors.csv`` holds the
stacked shares with mean counts and mean retried requests.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.experiments.figures.base import (
    add_footer,
    pyplot,
    save_figure,
)
from narwhal.experiments.recipes import RetriesOptions
from narwhal.experiments.worker import ERROR_PREFIX

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult

FRACTIONS = [round(0.01 * i, 2) for i in range(1, 100)] + [0.995, 0.999, 1.0]
CLASS_COLOURS = [
    "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#1f77b4", "#2ca02c",
]  # fmt: skip


def _failed_interval(point: dict[str, Any]) -> dict[str, float | None]:
    """The share of requests failed with its t interval over replicates (from success's)."""
    low, high = point.get("success_pct_ci_low"), point.get("success_pct_ci_high")
    return {
        "failed_pct_ci_low": None if high is None else 100.0 - high,
        "failed_pct_ci_high": None if low is None else 100.0 - low,
    }


def _label(point: Any) -> str:
    return str(point.params["case"]) if "case" in point.params else point.label()


def draw(result: SweepResult, options: RetriesOptions, out: Path) -> list[Path]:
    plt = pyplot()
    pooled: dict[int, list[float]] = defaultdict(list)
    totals: dict[int, int] = defaultdict(int)
    for task, outcome in zip(result.plan.tasks, result.outcomes, strict=True):
        pooled[task.point].extend(outcome.first_bytes or ())
        totals[task.point] += int(outcome.metrics["requests"])
    labels = [_label(p) for p in result.plan.points]

    fig, (ax, tail) = plt.subplots(1, 2, figsize=(13, 5.4))
    cdf_rows: list[dict[str, Any]] = []
    for point, label in zip(result.plan.points, labels, strict=True):
        values = sorted(pooled[point.index])
        total = totals[point.index] or 1
        ys = [(i + 1) / total for i in range(len(values))]
        ax.step(
            values, ys, where="post", lw=1.6, label=f"{label} ({100 * len(values) / total:.2f}% ok)"
        )
        tail.step(values, [1.0 - y for y in ys], where="post", lw=1.6, label=label)
        for fraction in FRACTIONS:
            k = round(fraction * total) - 1
            value = values[max(0, k)] if k < len(values) and values else None
            cdf_rows.append(
                {"setting": label, "fraction_of_requests": fraction, "first_byte_s": value}
            )
    for axis in (ax, tail):
        axis.set_xscale("log")
        if options.x_max_s is not None:
            axis.set_xlim(right=options.x_max_s)
        axis.set_xlabel("first_byte_s: time to the first token at the client (s, log)")
        axis.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("fraction of all requests with their first byte by then")
    ax.legend(loc="upper left", fontsize=8.5)
    ax.set_title("CDF of first_byte_s over all requests (failed ones never arrive)", fontsize=10)
    tail.set_yscale("log")
    tail.set_xlim(left=0.2)
    tail.set_ylim(bottom=5e-3)
    tail.set_ylabel("fraction of all requests still without a first byte (log)")
    tail.set_title("the tail: 1 - CDF; each curve ends at its failure share", fontsize=10)
    fig.suptitle(f"{result.spec.sweep.name}: time to first byte by retry setting", fontsize=11)
    add_footer(fig, result, width=150, fontsize=6.5)
    files = save_figure(
        fig, out, "retries_cdf", ["setting", "fraction_of_requests", "first_byte_s"], cdf_rows
    )

    classes = sorted({k for row in result.points for k in row if k.startswith(ERROR_PREFIX)})
    error_rows: list[dict[str, Any]] = []
    fig, ax = plt.subplots(figsize=(9.5, 5.2))
    ticks = [textwrap.fill(label, 18) for label in labels]
    ax.bar(ticks, [0.0] * len(ticks))  # the categories, even with no failure at all
    bottoms = [0.0] * len(labels)
    for c, key in enumerate(classes):
        shares = []
        for i, row in enumerate(result.points):
            requests = row["requests"] or 1.0
            share = 100.0 * (row.get(key) or 0.0) / requests
            shares.append(share)
            error_rows.append(
                {
                    "setting": labels[i],
                    "error_class": key[len(ERROR_PREFIX) :],
                    "requests_pct": share,
                    "mean_count": row.get(key) or 0.0,
                    "mean_requests": row["requests"],
                    "mean_retried_requests": row["retried_requests"],
                    **_failed_interval(row),
                }
            )
        ax.bar(
            ticks,
            shares,
            bottom=bottoms,
            color=CLASS_COLOURS[c % len(CLASS_COLOURS)],
            label=key[len(ERROR_PREFIX) :],
        )
        bottoms = [b + s for b, s in zip(bottoms, shares, strict=True)]
    if not classes:
        error_rows += [
            {"setting": label, "error_class": "none", "requests_pct": 0.0, "mean_count": 0.0,
             "mean_requests": row["requests"], "mean_retried_requests": row["retried_requests"],
             **_failed_interval(row)}
            for label, row in zip(labels, result.points, strict=True)
        ]  # fmt: skip
    for i, row in enumerate(result.points):
        failed = _failed_interval(row)
        span = ""
        if failed["failed_pct_ci_low"] is not None:
            span = f" [{failed['failed_pct_ci_low']:.2f}, {failed['failed_pct_ci_high']:.2f}]"
        ax.annotate(
            f"{100 - row['success_pct']:.2f}% failed{span}\n{row['retried_requests']:.0f} retried",
            (i, bottoms[i]),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 3),
            textcoords="offset points",
        )
    ax.set_ylim(0, max([*bottoms, 0.1]) * 1.3)
    ax.set_ylabel("requests failed (% of all, mean over replicates)")
    ax.set_title(
        f"{result.spec.sweep.name}: failures by error class and retry setting", fontsize=10
    )
    ax.tick_params(axis="x", labelsize=8.5)
    if classes:
        ax.legend(title="error class", fontsize=8, loc="upper right")
    add_footer(fig, result, width=150, fontsize=6.5)
    files += save_figure(
        fig,
        out,
        "retries_errors",
        [
            "setting",
            "error_class",
            "requests_pct",
            "mean_count",
            "mean_requests",
            "mean_retried_requests",
            "failed_pct_ci_low",
            "failed_pct_ci_high",
        ],
        error_rows,
    )
    return files
