"""What each part of the engine model contributes to its error on the bundled real runs.

    python benchmarks/simulator/fidelity_ablation.py

For each run in tests/data/runs, replays it (narwhal validate's replay) with the full model and
with one part taken out at a time, and prints the mean TTFT, TPOT and end-to-end errors (%) and
the p-value of the two-sample KS test on TPOT (whether the shape holds, not only the mean):
- no prefix identity: every prompt unique (the run's dataset not read), so no prefix-cache hits;
- eager: no CUDA-graph padding (the profile's eager times at the batch's own size);
- no skew: decodes of unequal contexts priced as many of their mean context (alpha 0);
- one skew alpha: decode-only steps pay the mixed steps' alpha (the profile's skew rows not
  split by regime: nearly all of them are mixed);
- no all-reduce: a TP > 1 engine without its all-reduces.
The docs/simulator.md Fidelity table is this script's output.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from statistics import mean

from narwhal.sim.validation.compare import compare
from narwhal.sim.validation.replay import replay
from narwhal.sim.validation.runlog import RunLog, read_run
from narwhal.sim.validation.validate import load_profile

RUNS = Path(__file__).resolve().parents[2] / "tests" / "data" / "runs"


Figures = tuple[float, float, float, float]  # TTFT, TPOT, E2E mean errors (%), TPOT KS p


def errors(run: RunLog, profile: dict, allreduce: bool = True) -> Figures:
    timed = replay(run, profile, allreduce=allreduce)
    real = run.requests

    def err(sim: list[float], ref: list[float]) -> float:
        return 100.0 * (mean(sim) / mean(ref) - 1.0)

    tpot_real = [r.tpot_s for r in real if r.tpot_s is not None]
    tpot_sim = [t.tpot_s for t in timed if t.tpot_s is not None]
    return (
        err([t.ttft_s for t in timed], [r.ttft_s for r in real]),
        err(tpot_sim, tpot_real),  # type: ignore[arg-type]
        err([t.latency_s for t in timed], [r.latency_s for r in real]),
        compare(tpot_real, tpot_sim)["ks_p"],  # type: ignore[arg-type]
    )


def show(name: str, label: str, figures: Figures) -> None:
    ttft, tpot, e2e, ks_p = figures
    print(f"{name:<28}{label:<22}{ttft:>+7.1f}%{tpot:>+7.1f}%{e2e:>+7.1f}%{ks_p:>11.2g}")


def main() -> None:
    print(f"{'run':<28}{'variant':<22}{'TTFT':>8}{'TPOT':>8}{'E2E':>8}{'TPOT KS p':>11}")
    for run_dir in sorted(p.parent for p in RUNS.glob("*/*/vllm")):
        run = read_run(run_dir)
        profile = load_profile(None, run)
        name = f"{run.gpu} {run.engine.model.split('/')[-1]}"
        variants = {"full model": run}
        no_prefix = tuple(dataclasses.replace(r, segments=()) for r in run.requests)
        variants["no prefix identity"] = dataclasses.replace(run, requests=no_prefix)
        eager = dataclasses.replace(run.engine, enforce_eager=True)
        variants["eager (no graphs)"] = dataclasses.replace(run, engine=eager)
        for label, variant in variants.items():
            show(name, label, errors(variant, profile))
        unskewed = copy.deepcopy(profile)
        for tables in unskewed["tp"].values():
            tables["skew_alpha"] = {"decode": 0.0, "mixed": 0.0}
        one_alpha = copy.deepcopy(profile)
        for tables in one_alpha["tp"].values():
            tables["skew_alpha"]["decode"] = tables["skew_alpha"]["mixed"]
        for label, changed in (("no skew", unskewed), ("one skew alpha", one_alpha)):
            show(name, label, errors(run, changed))
        if run.engine.tensor_parallel > 1:
            show(name, "no all-reduce", errors(run, profile, allreduce=False))


if __name__ == "__main__":
    main()
