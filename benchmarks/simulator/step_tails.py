"""How much p99 and SLO attainment move with the host overhead and the step-time tail. Not a
test.

The simulator's default scenario (4P+4D llama3-8b on H200, the Azure conversation trace) with
its faults removed, so that only the step model differs, at a few multiples of the trace's rate
up to and past saturation, under these cases of ``[fleet]`` (each its own seeds, the same
arrivals in every case at a rate and seed):

- ``flat``: today's default, a flat 2 ms host overhead and uniform ±5% jitter;
- ``per-seq 20us`` / ``per-seq 50us``: plus 20 or 50 µs of host work per scheduled sequence;
- ``stragglers 1% x3`` / ``5% x3``: the flat overhead with 1% or 5% of steps 3 times as long.

It writes ``step_tails.csv`` (one row per run) and ``step_tails.png`` (p99 TTFT, p99 TPOT and
SLO attainment against the offered rate, the mean over seeds) under ``--out``:

    .venv/bin/python benchmarks/simulator/step_tails.py [--out docs/figures/tails] [--seeds 1] \
        [--duration 10]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import csv
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from narwhal.config_file import parse_toml
from narwhal.core.records import DecisionLog
from narwhal.sim.results import record_rows, summarize
from narwhal.sim.runner import run
from narwhal.sim.scenario import ScenarioError, default_scenario_text, parse_scenario

CASES: dict[str, dict[str, float]] = {
    "flat": {},
    "per-seq 20us": {"step_overhead_per_seq_us": 20.0},
    "per-seq 50us": {"step_overhead_per_seq_us": 50.0},
    "stragglers 1% x3": {"straggler_rate": 0.01, "straggler_factor": 3.0},
    "stragglers 5% x3": {"straggler_rate": 0.05, "straggler_factor": 3.0},
}
RATE_SCALES = (24.0, 32.0, 40.0)  # x the trace's recorded rate (saturation: 30-40x)
FIELDS = ("case", "rate_scale", "seed", "requests", "offered_rps", "p99_ttft_s", "p99_tpot_s",
          "p50_tpot_s", "slo_attainment_pct")  # fmt: skip


def simulate(case: str, rate_scale: float, seed: int, duration_s: float) -> dict[str, Any]:
    data = parse_toml(default_scenario_text(), "default.toml", ScenarioError)
    data.pop("faults", None)
    data["fleet"].update(CASES[case])
    data["workload"].update(rate_scale=rate_scale, duration_s=duration_s)
    result = run(parse_scenario(data), seed, log=DecisionLog(enabled=False))
    summary = summarize(result, record_rows(result))
    return {
        "case": case,
        "rate_scale": rate_scale,
        "seed": seed,
        "requests": summary["requests"],
        "offered_rps": summary["offered_rps"],
        "p99_ttft_s": summary["first_byte_s"]["p99"],
        "p99_tpot_s": summary["tpot_s"]["p99"],
        "p50_tpot_s": summary["tpot_s"]["p50"],
        "slo_attainment_pct": summary["slo_attainment_pct"],
    }


def draw(rows: list[dict[str, Any]], path: Path) -> None:
    panels = (("p99_ttft_s", "p99 TTFT (s)"), ("p99_tpot_s", "p99 TPOT (s)"),
              ("slo_attainment_pct", "SLO attainment (%)"))  # fmt: skip
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        scales = sorted({r["rate_scale"] for r in mine})
        xs = [statistics.fmean(r["offered_rps"] for r in mine if r["rate_scale"] == s)
              for s in scales]  # fmt: skip
        for axis, (key, label) in zip(axes, panels, strict=True):
            ys = [statistics.fmean(r[key] for r in mine if r["rate_scale"] == s) for s in scales]
            axis.plot(xs, ys, marker="o", label=case)
            axis.set_xlabel("offered rate (requests/s)")
            axis.set_ylabel(label)
    axes[0].set_yscale("log")
    axes[2].legend(fontsize=8)
    figure.suptitle("default scenario without faults: host overhead and step-time tail")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/figures/tails"))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the trace")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate_scale in RATE_SCALES:
        for seed in range(1, args.seeds + 1):
            for case in CASES:
                rows.append(simulate(case, rate_scale, seed, args.duration))
                print(rows[-1], flush=True)
    with (args.out / "step_tails.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    draw(rows, args.out / "step_tails.png")


if __name__ == "__main__":
    main()
