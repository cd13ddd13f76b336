"""Flow control against plain admission, per workload class, across offered load.

Rule kept here: both arms of a comparison see the same arrivals (replicate k of every cell runs
seed ``seed + k``: common random numbers), so per-class differences are paired; each figure is
a mean over replicates with its Student t interval.

Theory of operation: for each rate multiplier (x the scenario's ``[workload] rate``) and each
replicate, the scenario runs with ``[flow] enabled`` false and true; the per-class summary
(:mod:`narwhal.sim.classes`) gives SLO attainment, success and TTFT p90; a table goes to stdout
and every run's figures to ``--out``/flow_compare.csv.

    python benchmarks/simulator/flow_compare.py experiments/scenarios/flow-overload.toml \\
        --rates 0.5 1 2 3 --replicates 5 --out docs/figures/flow
"""

from __future__ import annotations

import argparse
import csv
import tomllib
from pathlib import Path
from typing import Any

from narwhal.experiments.stats import mean_interval, paired_interval
from narwhal.sim.results import summarize
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario


def one(data: dict[str, Any], rate: float, flow: bool, seed: int) -> dict[str, Any]:
    """The per-class summary of one run."""
    data = {**data, "workload": {**data["workload"], "rate": rate}}
    data["flow"] = {**data.get("flow", {}), "enabled": flow}
    scenario = parse_scenario(data)
    classes: dict[str, Any] = summarize(run(scenario, seed))["classes"]
    return classes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0, 3.0])
    parser.add_argument("--replicates", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    data = tomllib.loads(Path(args.scenario).read_text("utf-8"))
    base = float(data["workload"]["rate"])
    rows: list[dict[str, Any]] = []
    for multiplier in args.rates:
        runs = {
            flow: [
                one(data, base * multiplier, flow, args.seed + k) for k in range(args.replicates)
            ]
            for flow in (False, True)
        }
        for name in runs[False][0]:
            line = [f"x{multiplier:g} {name:>10}"]
            for key in ("slo_attainment_pct", "success_pct"):
                off = [r[name][key] for r in runs[False]]
                on = [r[name][key] for r in runs[True]]
                a, b = mean_interval(off, 0.95), mean_interval(on, 0.95)
                d = paired_interval(on, off, 0.95)
                line.append(
                    f"{key.split('_')[0]} plain {a.mean:6.2f} [{a.low:6.2f},{a.high:6.2f}]"
                    f" flow {b.mean:6.2f} [{b.low:6.2f},{b.high:6.2f}] d {d.mean:+7.2f}"
                )
            p90 = [r[name]["first_byte_s"]["p90"] for r in runs[True]]
            p90_off = [r[name]["first_byte_s"]["p90"] for r in runs[False]]
            line.append(
                f"TTFT p90 plain {mean_interval(p90_off, 0.95).mean or 0:.3f} s"
                f" flow {mean_interval(p90, 0.95).mean or 0:.3f} s"
            )
            print(" | ".join(line), flush=True)
            for flow, results in runs.items():
                for k, classes in enumerate(results):
                    c = classes[name]
                    rows.append(
                        {
                            "rate_x": multiplier,
                            "flow": flow,
                            "replicate": k,
                            "class": name,
                            "requests": c["requests"],
                            "success_pct": c["success_pct"],
                            "slo_attainment_pct": c["slo_attainment_pct"],
                            "shed": c["shed"],
                            "first_byte_p90_s": c["first_byte_s"]["p90"],
                        }
                    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "flow_compare.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
