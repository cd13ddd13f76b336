"""Routing policies side by side on one scenario: prefix-cache hit rate and client TTFT.

Usage (from the repository root):

    PYTHONPATH=. .venv/bin/python benchmarks/simulator/kv_routing.py \
        [--scenario experiments/scenarios/mooncake-fleet.toml] [--duration-s 300]
        [--rate-scale 4] [--seed 0] [--seeds N | --starts S [S ...]] [--csv FILE]
        POLICY [POLICY ...]

Each POLICY (a ``[routing]`` name, e.g. ``round_robin prefix_affinity kv_aware``) places both
phases of the scenario (by default experiments/scenarios/mooncake-fleet.toml: 4P+4D llama3-8b,
the Mooncake conversation trace, prefix caching on, no faults); a trace workload's rate is
scaled by ``--rate-scale`` and runs for ``--duration-s`` (other workloads run as the scenario
says); one run per policy and replicate, the same arrivals for every policy of a replicate.
Replicate *k* runs seed ``--seed + k`` and, with ``--starts``, the trace window starting at the
*k*-th of those trace seconds (a trace's arrivals do not depend on the seed, so windows are what
varies its traffic); ``--seeds`` replicates without ``--starts``. Prints one markdown row per
policy and replicate: requests, success %, prefix-cache hit rate (every engine's hits over its
lookups, as vLLM's counters), client TTFT p50 / p99 (``first_byte_s``); wall seconds on stderr.
With two replicates or more it then prints, for every policy against each named before it, the
mean paired difference over replicates of the hit rate and of TTFT p50 with its 95% Student t
interval (:func:`narwhal.experiments.stats.paired_interval`). ``--csv`` writes every run's row.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from narwhal.experiments.stats import paired_interval  # noqa: E402
from narwhal.sim.results import summarize  # noqa: E402
from narwhal.sim.runner import run  # noqa: E402
from narwhal.sim.scenario import Scenario, load_scenario  # noqa: E402

SCENARIO = ROOT / "experiments" / "scenarios" / "mooncake-fleet.toml"


def with_policy(
    base: Scenario, policy: str, duration_s: float, rate_scale: float, start_s: float = 0.0
) -> Scenario:
    router = base.router
    routing = router.routing.model_copy(update={"prefill": policy, "decode": policy})
    workload = base.workload
    if workload.kind == "trace":
        workload = workload.model_copy(
            update={"duration_s": duration_s, "rate_scale": rate_scale, "start_s": start_s}
        )
    return base.model_copy(
        update={"router": router.model_copy(update={"routing": routing}), "workload": workload}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("policies", nargs="+")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--rate-scale", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--starts", type=float, nargs="+", default=None)
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args()
    base = load_scenario(args.scenario)
    rows: list[dict[str, object]] = []
    starts = args.starts if args.starts is not None else [0.0] * args.seeds
    print(
        "| policy | seed | start s | requests | success % | prefix-cache hit rate "
        "| TTFT p50 s | TTFT p99 s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for k, start_s in enumerate(starts):
        seed = args.seed + k
        for policy in args.policies:
            started = time.perf_counter()
            scenario = with_policy(base, policy, args.duration_s, args.rate_scale, start_s)
            result = run(scenario, seed)
            summary = summarize(result)
            ttft = summary["first_byte_s"]
            row = {
                "policy": policy,
                "seed": seed,
                "start_s": start_s,
                "requests": summary["requests"],
                "success_pct": round(summary["success_pct"], 4),
                "prefix_cache_hit_rate": round(summary["prefix_cache_hit_rate"], 6),
                "first_byte_p50_s": round(ttft["p50"], 6),
                "first_byte_p99_s": round(ttft["p99"], 6),
            }
            rows.append(row)
            print(
                f"| {policy} | {seed} | {start_s:g} | {row['requests']} | "
                f"{summary['success_pct']:.2f} | "
                f"{summary['prefix_cache_hit_rate']:.3f} | {ttft['p50']:.3f} | {ttft['p99']:.3f} |",
                flush=True,
            )
            print(f"  ({time.perf_counter() - started:.0f} s wall)", file=sys.stderr)
    if args.csv is not None:
        with args.csv.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if len(starts) >= 2:
        print_differences(rows, args.policies)


def print_differences(rows: list[dict[str, object]], policies: list[str]) -> None:
    """Paired differences over replicates, each policy minus every one named before it, 95% t
    intervals."""
    print()
    print("| A - B | hit rate difference [95% interval] | TTFT p50 difference s [95% interval] |")
    print("|---|---|---|")
    for later, a in enumerate(policies):
        for b in policies[:later]:
            cells = []
            for key in ("prefix_cache_hit_rate", "first_byte_p50_s"):
                xs = [float(str(r[key])) for r in rows if r["policy"] == a]
                ys = [float(str(r[key])) for r in rows if r["policy"] == b]
                i = paired_interval(xs, ys, 0.95)
                cells.append(f"{i.mean:+.3f} [{i.low:+.3f}, {i.high:+.3f}]")
            print(f"| {a} - {b} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
