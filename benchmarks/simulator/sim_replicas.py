"""What unshared router state costs: N independent router replicas (``[router] replicas``) in
front of one simulated fleet, N = 1, 2, 4, 8, drawn as one figure with its CSV.

Usage (from the repository root):

    .venv/bin/python benchmarks/simulator/sim_replicas.py [--seeds 1 2 3] \
        [--out docs/figures/replicas]

Two cases on experiments/scenarios/faulty-fleet.toml's fleet and workload (4P+4D
llama3-70b-tp4, the Azure conversation trace at 6x for 60 s, ``eject_after = 3``,
``max_attempts = 2``): its own rate-based fault mix, and "one bad engine per role" (one
producer answers every request with HTTP 500 and one consumer every stream with an in-band
error, for the whole run), where each replica must see its own ``eject_after`` failures before
it stops using them. Requests are spread over the replicas at random (``spread = "random"``,
the ``SO_REUSEPORT`` / L4-hash model). Per case and N, the mean over seeds of: requests that
failed, attempts that failed (each one a failure some engine caused and some replica was
charged for), ejections (summed over replicas), goodput (requests on time per second) and the
client's TTFT p99. Writes ``replicas.png`` and ``replicas.csv`` (byte-stable for the same
seeds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from narwhal.experiments.figures.base import pyplot, save_figure  # noqa: E402
from narwhal.sim.faults import FaultSpec  # noqa: E402
from narwhal.sim.replicas import RouterReplicaSettings  # noqa: E402
from narwhal.sim.results import summarize  # noqa: E402
from narwhal.sim.runner import run  # noqa: E402
from narwhal.sim.scenario import Scenario, load_scenario  # noqa: E402

SCENARIO = ROOT / "experiments" / "scenarios" / "faulty-fleet.toml"
COUNTS = (1, 2, 4, 8)
ONE_BAD = (
    FaultSpec(kind="http_5xx", engine="http://sim-p0", at_s=0.0, duration_s=3600.0),
    FaultSpec(kind="inband_error", engine="http://sim-d0", at_s=0.0, duration_s=3600.0),
)
FIELDS = [
    "case", "replicas", "seeds", "requests", "failed_requests", "failed_attempts", "ejections",
    "goodput_rps", "success_pct", "ttft_p99_s",
]  # fmt: skip


def cases() -> dict[str, Scenario]:
    base = load_scenario(SCENARIO)
    return {
        "faulty-fleet fault mix": base,
        "one bad engine per role": base.model_copy(update={"faults": ONE_BAD}),
    }


def point(case: str, scenario: Scenario, replicas: int, seeds: list[int]) -> dict[str, Any]:
    settings = RouterReplicaSettings(replicas=replicas, spread="random")
    totals: dict[str, float] = dict.fromkeys(FIELDS[3:], 0.0)
    for seed in seeds:
        result = run(scenario.model_copy(update={"replicas": settings}), seed)
        summary = summarize(result)
        totals["requests"] += summary["requests"]
        totals["failed_requests"] += summary["requests"] - summary["succeeded"]
        totals["failed_attempts"] += sum(
            r.attempts - (1 if r.status == 200 else 0) for r in result.records
        )
        totals["ejections"] += summary["ejections"]
        totals["goodput_rps"] += summary["on_time_rps"] or 0.0
        totals["success_pct"] += summary["success_pct"]
        totals["ttft_p99_s"] += summary["first_byte_s"]["p99"] or 0.0
    row: dict[str, Any] = {"case": case, "replicas": replicas, "seeds": len(seeds)}
    row.update({key: round(value / len(seeds), 4) for key, value in totals.items()})
    print(f"  {case}, {replicas} replicas: {row}", flush=True)
    return row


def draw(rows: list[dict[str, Any]], seeds: list[int], out: Path) -> list[Path]:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = (
        ("failed_requests", "requests failed (client saw an error)"),
        ("failed_attempts", "attempts failed (charged to an engine)"),
        ("goodput_rps", "goodput (requests on time per second)"),
        ("ttft_p99_s", "client TTFT p99 (s)"),
    )
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for marker, case in zip("os", dict.fromkeys(r["case"] for r in rows), strict=False):
            mine = [r for r in rows if r["case"] == case]
            ax.plot([r["replicas"] for r in mine], [r[key] for r in mine], marker=marker,
                    label=case)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(COUNTS), [str(n) for n in COUNTS])
        ax.set_xlabel("router replicas (independent state, random spread)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=9)
    fig.suptitle(
        "What unshared router state costs: faulty-fleet (4P+4D llama3-70b-tp4, Azure conv x6, "
        f"60 s, eject_after 3, max_attempts 2), mean of seeds {', '.join(map(str, seeds))}\n"
        "command: .venv/bin/python benchmarks/simulator/sim_replicas.py "
        "--out docs/figures/replicas",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return save_figure(fig, out, "replicas", FIELDS, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "replicas")
    args = parser.parse_args()
    rows = [
        point(case, scenario, n, args.seeds) for case, scenario in cases().items() for n in COUNTS
    ]
    for path in draw(rows, args.seeds, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
