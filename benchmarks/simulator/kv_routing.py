"""Routing policies side by side on one scenario: prefix-cache hit rate and client TTFT.

Usage (from the repository root):

    PYTHONPATH=. .venv/bin/python benchmarks/simulator/kv_routing.py \
        [--scenario experiments/scenarios/mooncake-fleet.toml] [--duration-s 300]
        [--rate-scale 4] [--seed 0] POLICY [POLICY ...]

Each POLICY (a ``[routing]`` name, e.g. ``round_robin prefix_affinity kv_aware``) places both
phases of the scenario (by default experiments/scenarios/mooncake-fleet.toml: 4P+4D llama3-8b,
the Mooncake conversation trace, prefix caching on, no faults); a trace workload's rate is
scaled by ``--rate-scale`` and runs for ``--duration-s`` (other workloads run as the scenario
says); one run per policy, the same arrivals for all. Prints one markdown row per
policy: requests, success %, prefix-cache hit rate (every engine's hits over its lookups, as
vLLM's counters), client TTFT p50 / p99 (``first_byte_s``), wall seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from narwhal.sim.results import summarize  # noqa: E402
from narwhal.sim.runner import run  # noqa: E402
from narwhal.sim.scenario import Scenario, load_scenario  # noqa: E402

SCENARIO = ROOT / "experiments" / "scenarios" / "mooncake-fleet.toml"


def with_policy(base: Scenario, policy: str, duration_s: float, rate_scale: float) -> Scenario:
    router = base.router
    routing = router.routing.model_copy(update={"prefill": policy, "decode": policy})
    workload = base.workload
    if workload.kind == "trace":
        workload = workload.model_copy(update={"duration_s": duration_s, "rate_scale": rate_scale})
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
    args = parser.parse_args()
    base = load_scenario(args.scenario)
    print("| policy | requests | success % | prefix-cache hit rate | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|")
    for policy in args.policies:
        started = time.perf_counter()
        result = run(with_policy(base, policy, args.duration_s, args.rate_scale), args.seed)
        summary = summarize(result)
        ttft = summary["first_byte_s"]
        print(
            f"| {policy} | {summary['requests']} | {summary['success_pct']:.2f} | "
            f"{summary['prefix_cache_hit_rate']:.3f} | {ttft['p50']:.3f} | {ttft['p99']:.3f} |",
            flush=True,
        )
        print(f"  ({time.perf_counter() - started:.0f} s wall)", file=sys.stderr)


if __name__ == "__main__":
    main()
