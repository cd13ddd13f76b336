"""kv_aware against the other routing policies, cell by cell, with paired intervals: the
evidence the default prefill policy is chosen on.

Usage (from the repository root, after the four ``experiments/routing-kv-*.toml`` sweeps):

    PYTHONPATH=. .venv/bin/python benchmarks/simulator/kv_routing_evidence.py \\
        [--sweeps docs/figures/routing-kv] [--out docs/figures/routing-kv]

Reads each sweep's ``runs.csv`` under ``--sweeps`` (``mooncake-4``, ``mooncake-8``,
``shared-4``, ``shared-8``: two workloads x fleets of 4 and 8 engines, each at two rates per
engine, 5 replicates seeded by replicate, so every policy of a replicate saw the same arrivals).
A *cell* is one (workload, fleet, rate). In every cell, kv_aware's per-replicate value minus
each other policy's, on the prefix-cache hit rate, the client's TTFT p50 and p99
(``first_byte_s``) and SLO attainment, gives a paired Student t interval at 95% simultaneous
over the grid's cells (Bonferroni: each at ``1 - 0.05 / cells``), through
:func:`narwhal.experiments.stats.paired_interval`. Writes ``evidence.csv`` (one row per cell,
opponent and metric: mean difference, interval, ``verdict`` better / worse / unresolved for
kv_aware) and ``evidence.png`` (the intervals against the shipped default ``least_reserved``
and against ``prefix_affinity``), and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from narwhal.experiments.figures.base import pyplot, save_figure  # noqa: E402
from narwhal.experiments.stats import paired_interval  # noqa: E402

SWEEPS = ("mooncake-4", "mooncake-8", "shared-4", "shared-8")
OPPONENTS = ("least_reserved", "round_robin", "least_loaded", "prefix_affinity")
# metric -> +1 when higher is better for kv_aware, -1 when lower is
METRICS = {
    "prefix_cache_hit_rate": 1,
    "first_byte_p50_s": -1,
    "first_byte_p99_s": -1,
    "slo_attainment_pct": 1,
}
CONFIDENCE = 0.95


def load(sweeps: Path) -> dict[tuple[str, float], dict[str, dict[int, dict[str, Any]]]]:
    """(sweep, rate multiplier) -> policy -> replicate -> run row."""
    cells: dict[tuple[str, float], dict[str, dict[int, dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for name in SWEEPS:
        with (sweeps / name / "runs.csv").open() as file:
            for row in csv.DictReader(file):
                rate = float(row["rate_multiplier"])
                cells[(name, rate)][row["case"]][int(row["replicate"])] = row
    return cells


def verdict(low: float, high: float, sign: int) -> str:
    """kv_aware's standing on a metric whose interval of differences is [low, high]."""
    if low == high == 0.0:
        return "equal"
    if sign * low > 0 and sign * high > 0:
        return "better"
    if sign * low < 0 and sign * high < 0:
        return "worse"
    return "unresolved"


def evidence(
    cells: dict[tuple[str, float], dict[str, dict[int, dict[str, Any]]]],
) -> list[dict[str, Any]]:
    per_cell = 1.0 - (1.0 - CONFIDENCE) / len(cells)
    rows = []
    for (name, rate), policies in sorted(cells.items()):
        kv = policies["kv_aware"]
        offered = sum(float(r["offered_rps"]) for r in kv.values()) / len(kv)
        for opponent in OPPONENTS:
            other = policies[opponent]
            reps = sorted(set(kv) & set(other))
            for metric, sign in METRICS.items():
                mine = [float(kv[k][metric]) for k in reps]
                theirs = [float(other[k][metric]) for k in reps]
                i = paired_interval(mine, theirs, per_cell)
                rows.append(
                    {
                        "sweep": name,
                        "rate_multiplier": rate,
                        "offered_rps": round(offered, 3),
                        "opponent": opponent,
                        "metric": metric,
                        "kv_aware": round(sum(mine) / len(mine), 6),
                        "opponent_value": round(sum(theirs) / len(theirs), 6),
                        "difference": round(i.mean, 6),
                        "low": round(i.low, 6),
                        "high": round(i.high, 6),
                        "replicates": len(reps),
                        "per_cell_confidence": round(per_cell, 5),
                        "verdict": verdict(i.low, i.high, sign),
                    }
                )
    return rows


def draw(rows: list[dict[str, Any]], out: Path) -> None:
    plt = pyplot()
    shown = ("least_reserved", "prefix_affinity")
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 4.6))
    labels = sorted({(r["sweep"], r["rate_multiplier"], r["offered_rps"]) for r in rows})
    for ax, metric in zip(axes, METRICS, strict=True):
        for k, opponent in enumerate(shown):
            xs, ys, errs = [], [], [[], []]
            for x, (name, rate, _) in enumerate(labels):
                (row,) = [
                    r
                    for r in rows
                    if (r["sweep"], r["rate_multiplier"], r["opponent"], r["metric"])
                    == (name, rate, opponent, metric)
                ]
                xs.append(x + (k - 0.5) * 0.3)
                ys.append(row["difference"])
                errs[0].append(row["difference"] - row["low"])
                errs[1].append(row["high"] - row["difference"])
            ax.errorbar(xs, ys, yerr=errs, fmt="os"[k], capsize=3, label=f"kv_aware - {opponent}")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([f"{n}\n{rps:g} req/s" for n, _, rps in labels], rotation=60, fontsize=7)
        better = "higher" if METRICS[metric] > 0 else "lower"
        ax.set_title(f"{metric} ({better} is better)", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "kv_aware minus the default (least_reserved) and prefix_affinity, per cell: paired "
        f"intervals, {CONFIDENCE:.0%} simultaneous over {len(labels)} cells, 5 replicates",
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, out, "evidence", list(rows[0]), rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=Path, default=ROOT / "docs/figures/routing-kv")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/figures/routing-kv")
    args = parser.parse_args()
    rows = evidence(load(args.sweeps))
    draw(rows, args.out)
    print("| cell | vs | metric | kv_aware | other | difference [interval] | verdict |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['sweep']} {r['offered_rps']:g} req/s | {r['opponent']} | {r['metric']} | "
            f"{r['kv_aware']:.4g} | {r['opponent_value']:.4g} | {r['difference']:+.4g} "
            f"[{r['low']:+.4g}, {r['high']:+.4g}] | {r['verdict']} |"
        )


if __name__ == "__main__":
    main()
