"""Two finished ``capacity`` sweeps drawn over each other: an old engine model against a new one.

Rule kept here: the comparison only reads what the two sweeps wrote (each folder's
``capacity.csv`` and ``sweep.json``) and never simulates; the sweeps must cover the same points
and rates (same fleet sizes, ratios and rate multipliers), or it refuses, naming what differs.
Each sweep's numbers are drawn as its own recipe drew them (goodput is DistServe's, per point;
a goodput below the lowest rate tried is an open downward triangle at that rate).

Theory of operation: :func:`compare_rows` pairs the two ``capacity.csv`` files row by row on
(fleet size, ratio, rate multiplier). :func:`draw` plots, left, each ratio's goodput against
fleet size, the old sweep dashed with open markers and the new one solid, and, right, the SLO
attainment curves of the largest fleet, old dashed and new solid; the footer names each sweep's
``[base]`` (where the engine model is pinned), its command and the command that redraws this
figure. ``capacity-compare.csv`` holds every paired row with the goodput change in percent (``nan``
where either goodput is only a bound: below the lowest rate tried or above the highest).

    python -m narwhal.experiments.figures.capacity_compare OLD_DIR NEW_DIR --out DIR
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

from narwhal.experiments.figures.base import pyplot, save_figure

MARKERS = "osD^vP*X"
KEY = ("fleet_size", "pd_ratio", "rate_multiplier")
STEM = "capacity-compare"


class CompareError(ValueError):
    """The two folders cannot be compared; the message says why."""


def read_sweep(folder: Path) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A capacity sweep's ``capacity.csv`` rows and its ``sweep.json``."""
    try:
        with (folder / "capacity.csv").open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        meta: dict[str, Any] = json.loads((folder / "sweep.json").read_text("utf-8"))
    except (OSError, ValueError) as error:
        raise CompareError(f"{folder}: not a finished capacity sweep ({error})") from None
    if not rows:
        raise CompareError(f"{folder}/capacity.csv: no rows")
    return rows, meta


def _number(text: str) -> float:
    return float(text) if text else math.nan


def _key(row: dict[str, str]) -> tuple[int, str, float]:
    return int(row["fleet_size"]), row["pd_ratio"], float(row["rate_multiplier"])


def compare_rows(old: list[dict[str, str]], new: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per (fleet size, ratio, rate multiplier) with the old and the new numbers."""
    olds = {_key(row): row for row in old}
    news = {_key(row): row for row in new}
    if olds.keys() != news.keys():
        only_old = sorted(olds.keys() - news.keys())
        only_new = sorted(news.keys() - olds.keys())
        raise CompareError(
            f"the sweeps cover different points: only in old {only_old}, only in new {only_new}"
        )
    rows: list[dict[str, Any]] = []
    for key in olds:  # the old sweep's order: its grid's
        o, n = olds[key], news[key]
        old_goodput, new_goodput = _number(o["goodput_rps"]), _number(n["goodput_rps"])
        bounded = o["goodput_bound"] or n["goodput_bound"]  # a bound, not a number: no change
        change = math.nan if bounded else (new_goodput / old_goodput - 1.0) * 100.0
        rows.append(
            {
                "fleet_size": key[0],
                "pd_ratio": key[1],
                "prefill": int(o["prefill"]),
                "decode": int(o["decode"]),
                "rate_multiplier": key[2],
                "old_offered_rps_per_engine": _number(o["offered_rps_per_engine"]),
                "new_offered_rps_per_engine": _number(n["offered_rps_per_engine"]),
                "old_slo_attainment_pct": _number(o["slo_attainment_pct"]),
                "new_slo_attainment_pct": _number(n["slo_attainment_pct"]),
                "old_goodput_rps": old_goodput,
                "new_goodput_rps": new_goodput,
                "old_goodput_rps_sd": _number(o["goodput_rps_sd"]),
                "new_goodput_rps_sd": _number(n["goodput_rps_sd"]),
                "old_goodput_bound": o["goodput_bound"],
                "new_goodput_bound": n["goodput_bound"],
                "goodput_change_pct": round(change, 1),
            }
        )
    return rows


def _goodput_line(
    axes: Any, rows: list[dict[str, Any]], which: str, r: int, ratio: str, shift: float
) -> None:
    """One sweep's goodput against fleet size for one ratio, drawn ``shift`` to the side (old
    and new apart, so their error bars do not hide each other); "below" points as open
    triangles."""
    solid = which == "new"
    mine = {row["fleet_size"]: row for row in rows if row["pd_ratio"] == ratio}
    sizes = sorted(mine)
    xs = [s + shift for s in sizes]
    ys = [
        math.nan
        if mine[s][f"{which}_goodput_bound"] == "below"
        else mine[s][f"{which}_goodput_rps"]
        for s in sizes
    ]
    spread = [mine[s][f"{which}_goodput_rps_sd"] for s in sizes]
    errors = [
        [0.0 if math.isnan(y) else min(e, y) for e, y in zip(spread, ys, strict=True)],
        spread,
    ]
    marker = MARKERS[r % len(MARKERS)]
    axes.errorbar(
        xs,
        ys,
        yerr=errors,
        marker=marker,
        mfc=f"C{r}" if solid else "white",
        color=f"C{r}",
        ls="-" if solid else "--",
        lw=1.8 if solid else 1.2,
        capsize=3,
        label=f"P:D = {ratio}, {which} model",
    )
    for s, x in zip(sizes, xs, strict=True):
        if mine[s][f"{which}_goodput_bound"] == "below":
            lowest = min(
                (row for row in rows if row["fleet_size"] == s and row["pd_ratio"] == ratio),
                key=lambda row: row["rate_multiplier"],
            )
            at = lowest[f"{which}_offered_rps_per_engine"] * s
            axes.plot([x], [at], marker="v", ms=8, mfc="none", color=f"C{r}", ls="none")


def _footer(
    old: dict[str, Any], new: dict[str, Any], old_dir: Path, new_dir: Path, out: Path
) -> str:
    def about(label: str, meta: dict[str, Any]) -> str:
        pins = ", ".join(
            f"{k} = {json.dumps(v)}"
            for k, v in meta.get("base", {}).items()
            if k.startswith("fleet.")
        )
        quick = " --quick" if meta.get("quick") else ""
        seed = meta.get("sweep", {}).get("seed")
        return (
            f"{label}: narwhal sweep {meta.get('spec')} --seed {seed}{quick}  |  "
            f"{meta.get('runs')} runs, {meta.get('simulated_requests', 0):,} simulated requests; "
            f"engines: {pins or 'as the scenario gives them (no fleet keys in [base])'}"
        )

    lines = [
        about("old", old),
        about("new", new),
        f"python -m narwhal.experiments.figures.capacity_compare {old_dir} {new_dir} --out {out}",
    ]
    return "\n".join(textwrap.fill(line, 190) for line in lines)


def draw(old_dir: Path, new_dir: Path, out: Path) -> list[Path]:
    """``capacity-compare.png`` and ``.csv`` in ``out``; the files written."""
    old_rows, old_meta = read_sweep(old_dir)
    new_rows, new_meta = read_sweep(new_dir)
    rows = compare_rows(old_rows, new_rows)
    ratios = list(dict.fromkeys(row["pd_ratio"] for row in rows))
    sizes = sorted({row["fleet_size"] for row in rows})
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6))
    step = (sizes[-1] - sizes[0]) / max(len(sizes) - 1, 1) or 1.0
    series = len(ratios) * 2
    for r, ratio in enumerate(ratios):
        for w, which in enumerate(("old", "new")):  # each series a little to the side
            shift = (2 * r + w - (series - 1) / 2) * 0.025 * step
            _goodput_line(left, rows, which, r, ratio, shift)
    left.set_xticks(sizes)
    left.set_ylim(bottom=0)
    left.set_xlabel("fleet size (engines)")
    left.set_ylabel("goodput (req/s with >= 90% of requests on time)")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7.5, ncol=2)
    left.set_title("goodput by fleet size and P:D ratio: old model dashed, new solid", fontsize=10)

    largest = sizes[-1]
    for r, ratio in enumerate(ratios):
        mine = [row for row in rows if row["fleet_size"] == largest and row["pd_ratio"] == ratio]
        for which in ("old", "new"):
            solid = which == "new"
            right.plot(
                [row[f"{which}_offered_rps_per_engine"] for row in mine],
                [row[f"{which}_slo_attainment_pct"] for row in mine],
                marker=MARKERS[r % len(MARKERS)],
                mfc=f"C{r}" if solid else "white",
                color=f"C{r}",
                ls="-" if solid else "--",
                lw=1.8 if solid else 1.2,
                label=f"P:D = {ratio}, {which} model",
            )
    bar = float(new_meta.get("goodput", {}).get("attainment_pct", 90.0))
    right.axhline(bar, color="#555555", ls=":", lw=1)
    right.text(right.get_xlim()[1], bar, f"{bar:g}% bar ", va="bottom", ha="right", fontsize=8)
    right.set_xlabel("offered load (req/s per engine)")
    right.set_ylabel("SLO attainment (% of requests on time)")
    right.set_ylim(0, 101)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7.5, ncol=2, loc="lower left")
    right.set_title(f"SLO attainment vs load, {largest} engines", fontsize=10)
    fig.suptitle(
        f"capacity, old engine model against new: {old_meta.get('name')} vs {new_meta.get('name')}",
        fontsize=11,
    )
    footer = _footer(old_meta, new_meta, old_dir, new_dir, out)
    fig.text(0.01, 0.01, footer, fontsize=7, va="bottom", ha="left", color="#333333")
    fig.tight_layout(rect=(0, 0.03 + 0.03 * footer.count("\n"), 1, 0.95))
    return save_figure(fig, out, STEM, list(rows[0]), rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m narwhal.experiments.figures.capacity_compare",
        description="Draw two finished capacity sweeps over each other (old model vs new).",
    )
    parser.add_argument("old", type=Path, help="the old model's sweep folder (--out of its sweep)")
    parser.add_argument("new", type=Path, help="the new model's sweep folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG and CSV")
    args = parser.parse_args(argv)
    try:
        written = draw(args.old, args.new, args.out)
    except CompareError as error:
        print(f"capacity_compare: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
