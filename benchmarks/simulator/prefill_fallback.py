"""What ``[routing] prefill_fallback = "local"`` buys under producer faults: the same runs with
the fallback off ("none", the default) and on, side by side.

Usage (from the repository root):

    .venv/bin/python benchmarks/simulator/prefill_fallback.py [--seeds 1 2 3]

Two fault cases on experiments/scenarios/faulty-fleet.toml's fleet and workload (4P+4D
llama3-70b-tp4, the Azure conversation trace at 6x for 60 s, ``eject_after = 3``,
``max_attempts = 2``, retry budget 20 % with a floor of 3): its own rate-based fault mix (both
roles), and "producer faults only": its producer faults (hangs, HTTP 500s) and its crashes
restricted to producers, each at three times its rate. Per case and setting, the sum over seeds
of: requests, requests failed, requests failed on a producer (the last engine of the record is a
producer: every producer attempt failed), requests the consumer prefilled after its producers
failed, and the mean over seeds of success %, goodput (requests on time per second) and the
client's TTFT p50 / p99. Prints one table (markdown); nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from narwhal.sim.results import summarize  # noqa: E402
from narwhal.sim.runner import run  # noqa: E402
from narwhal.sim.scenario import Scenario, load_scenario  # noqa: E402

SCENARIO = ROOT / "experiments" / "scenarios" / "faulty-fleet.toml"
PRODUCER_RATE_SCALE = 3.0


def with_fallback(scenario: Scenario, fallback: str) -> Scenario:
    router = scenario.router
    routing = router.routing.model_copy(update={"prefill_fallback": fallback})
    return scenario.model_copy(update={"router": router.model_copy(update={"routing": routing})})


def cases() -> dict[str, Scenario]:
    base = load_scenario(SCENARIO)
    producer_faults = tuple(
        spec.model_copy(
            update={"role": "prefill", "rate_per_hour": spec.rate_per_hour * PRODUCER_RATE_SCALE}
        )
        for spec in base.faults
        if spec.rate_per_hour is not None
        and (spec.role == "prefill" or (spec.role == "any" and spec.kind == "crash"))
    )
    return {
        "faulty-fleet fault mix": base,
        "producer faults only": base.model_copy(update={"faults": producer_faults}),
    }


def point(case: str, scenario: Scenario, fallback: str, seeds: list[int]) -> dict[str, Any]:
    producers = {e.url for e in scenario.router.engines if e.role.produces}
    row: dict[str, Any] = {"case": case, "prefill_fallback": fallback}
    sums = dict.fromkeys(("requests", "failed", "failed_on_producer", "fell_back"), 0)
    means = dict.fromkeys(("success_pct", "goodput_rps", "ttft_p50_s", "ttft_p99_s"), 0.0)
    for seed in seeds:
        result = run(with_fallback(scenario, fallback), seed)
        summary = summarize(result)
        failed = [r for r in result.records if r.status != 200]
        sums["requests"] += len(result.records)
        sums["failed"] += len(failed)
        sums["failed_on_producer"] += sum(
            1 for r in failed if r.engines and r.engines[-1] in producers
        )
        sums["fell_back"] += sum(1 for r in result.records if r.prefill_fallback)
        means["success_pct"] += summary["success_pct"]
        means["goodput_rps"] += summary["on_time_rps"] or 0.0
        means["ttft_p50_s"] += summary["first_byte_s"]["p50"] or 0.0
        means["ttft_p99_s"] += summary["first_byte_s"]["p99"] or 0.0
    row.update(sums)
    row.update({key: round(value / len(seeds), 3) for key, value in means.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    rows = [
        point(case, scenario, fallback, args.seeds)
        for case, scenario in cases().items()
        for fallback in ("none", "local")
    ]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[key]) for key in keys) + " |", flush=True)


if __name__ == "__main__":
    main()
