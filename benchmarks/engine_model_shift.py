"""How far the engine model's correction moves the sweep recipes: old model against new, same runs.

The old engine model is what ``experiments/capacity-old-model.toml`` pins through its ``[base]``
``fleet.*`` keys (its ``[quick]`` base gives the pins for Llama-3-8B); the new one is the
scenario's defaults. Nothing is written; the numbers are printed for docs/experiments.md.

    .venv/bin/python benchmarks/engine_model_shift.py recipes     # one point of each recipe
    .venv/bin/python benchmarks/engine_model_shift.py capacity    # one change at a time

``recipes`` runs replicate 0 of one representative point per recipe (the shipped settings) with
the old model and with the new. ``capacity`` runs three capacity points (all replicates) from
the old model, unpinning one group of ``fleet`` keys at a time, then all of them. Not a test.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from statistics import mean
from typing import Any

from narwhal.experiments.plan import RunTask, build_plan
from narwhal.experiments.spec import load_spec
from narwhal.experiments.worker import run_task

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
KEYS = ("success_pct", "slo_attainment_pct", "first_byte_p50_s", "first_byte_p99_s",
        "tpot_p50_s", "on_time_rps", "rejected_pct")  # fmt: skip

# one representative point per recipe: its shipped settings
PICKS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "tuning": lambda p: p["recovery.eject_after"] == 3 and p["recovery.failure_quarantine_s"] == 0,
    "retries": lambda p: p["case"] == "2 attempts, budget 20% (min 3)",
    "routing": lambda p: p["case"] == "least_reserved",
    "diffuse": lambda p: (
        p["case"] in ("1 down", "all 25%")
        and p["recovery.max_ejection_percent"] == 50
        and p["recovery.failure_quarantine_s"] == 0
    ),
}
RATES = {"tuning": (1.0, 2.0), "routing": (1.0, 3.0, 5.0)}
# the capacity points of the one-change-at-a-time table: (point index, rate multiplier)
CAPACITY_POINTS = ((7, 1.0), (1, 0.25), (8, 1.3))
GROUPS = {
    "+ all-reduce": ("tp_allreduce",),
    "+ 1024 / 8192": ("max_num_seqs", "max_num_batched_tokens"),
    "+ KV sizing, rank links": ("kv_cache_tokens", "link_bandwidth_gbps"),
}


def old_model_pins() -> dict[str, dict[str, Any]]:
    """The old model's ``fleet`` keys per model, as capacity-old-model.toml pins them."""
    spec = load_spec(EXPERIMENTS / "capacity-old-model.toml")

    def fleet(base: dict[str, Any]) -> dict[str, Any]:
        keys = {k.split(".", 1)[1]: v for k, v in base.items() if k.startswith("fleet.")}
        keys.pop("model", None)
        return keys

    quick = spec.quick_version().base
    return {"llama3-70b-tp4": fleet(spec.base), str(quick["fleet.model"]): fleet(quick)}


def _run(task: RunTask, pins: dict[str, Any]) -> dict[str, Any]:
    scenario = copy.deepcopy(task.scenario)
    scenario["fleet"].update(pins)
    return run_task(replace(task, scenario=scenario, samples=False)).metrics


def recipes() -> None:
    pins = old_model_pins()
    for name, pick in PICKS.items():
        plan = build_plan(load_spec(EXPERIMENTS / f"{name}.toml"))
        for task in plan.tasks:
            point = plan.points[task.point]
            if task.replicate != 0 or not pick(point.params):
                continue
            if name in RATES and task.rate_multiplier not in RATES[name]:
                continue
            model = task.scenario["fleet"].get("model", "llama3-8b")
            old, new = _run(task, pins[model]), _run(task, {})
            print(f"{name}: {point.label()}, rate x{task.rate_multiplier}", flush=True)
            for key in KEYS:
                print(f"    {key:20s} old {old[key]!s:>10}  new {new[key]!s:>10}")


def capacity() -> None:
    old = old_model_pins()["llama3-70b-tp4"]
    variants = {"old": old}
    for label, keys in GROUPS.items():
        variants[label] = {k: v for k, v in old.items() if k not in keys}
    variants["new"] = {}
    plan = build_plan(load_spec(EXPERIMENTS / "capacity.toml"))
    for index, rate in CAPACITY_POINTS:
        tasks = [t for t in plan.tasks if t.point == index and t.rate_multiplier == rate]
        print(f"{plan.points[index].label()}, rate x{rate}: {len(tasks)} replicates", flush=True)
        for label, pins in variants.items():
            runs = [_run(task, pins) for task in tasks]

            def avg(key: str, runs: list[dict[str, Any]] = runs) -> float:
                return mean(float(r[key]) for r in runs)

            print(
                f"    {label:26s} attainment {avg('slo_attainment_pct'):5.1f}%  "
                f"TTFT p50 {avg('first_byte_p50_s') * 1e3:5.0f} ms  "
                f"TPOT p50 {avg('tpot_p50_s') * 1e3:5.1f} ms",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", choices=("recipes", "capacity"))
    args = parser.parse_args()
    if args.what == "recipes":
        recipes()
    else:
        capacity()


if __name__ == "__main__":
    main()
