"""What each part of the engine model contributes to its error on the bundled real runs.

    python benchmarks/simulator/fidelity_ablation.py

For each run in tests/data/runs, replays it (narwhal validate's replay) with the full model and
with one part taken out at a time, and prints the mean TTFT, TPOT and end-to-end errors (%) and,
for a run with per-request timings, the p-value of the two-sample KS test on TPOT (whether the
shape holds, not only the mean):
- no prefix identity: every prompt unique (the run's dataset not read), so no prefix-cache hits;
- eager: no CUDA-graph padding (the profile's eager times at the batch's own size);
- async scheduling flipped: synchronous for a run that scheduled asynchronously (vLLM >= 0.14's
  default), asynchronous for one that did not;
- no skew: decodes of unequal contexts priced as many of their mean context (alpha 0);
- one skew alpha: decode-only steps pay the mixed steps' alpha (the profile's skew rows not
  split by regime: nearly all of them are mixed);
- no all-reduce: a TP > 1 engine without its all-reduces;
- for a run published as means only (its engine settings not recorded, vLLM's defaults taken):
  2048 batched tokens and no prefix cache, the settings LLMServingSim simulated it with; and
  every profiled time x 0.9 and x 1.1: how strongly its published figures answer to the step
  time (a sensitivity, never a correction).
A means-only run has only the figures it published (its output throughput as tok/s) and no KS
p-value (blank). The docs/simulator.md Fidelity tables are this script's output.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from statistics import mean

from narwhal.sim.validation.compare import compare
from narwhal.sim.validation.replay import replay
from narwhal.sim.validation.runlog import RunLog, read_run
from narwhal.sim.validation.validate import load_profile, paired_samples, simulated_means

RUNS = Path(__file__).resolve().parents[2] / "tests" / "data" / "runs"


Figures = dict[str, float]  # mean errors (%) of the metrics the run has, and "ks_p" (TPOT)
COLUMNS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "latency_ms": "E2E", "throughput_tok_s": "tok/s"}


def errors(run: RunLog, profile: dict, allreduce: bool = True) -> Figures:
    timed = replay(run, profile, allreduce=allreduce)
    samples = paired_samples(run, timed)
    out: Figures = {}
    if run.means is not None:
        real = dict(run.means.real)
        sim = simulated_means(run, timed, samples)
    else:
        out["ks_p"] = compare(*samples["tpot_ms"])["ks_p"]
        real = {metric: 1e3 * mean(values) for metric, (values, _) in samples.items()}
        sim = {metric: 1e3 * mean(values) for metric, (_, values) in samples.items()}
    for metric, value in real.items():
        out[metric] = 100.0 * (sim[metric] / value - 1.0)
    return out


def line(name: str, label: str, figures: Figures) -> str:
    cells = "".join(f"{figures[m]:>+7.1f}%" if m in figures else f"{'':>8}" for m in COLUMNS)
    tail = f"{figures['ks_p']:>11.2g}" if "ks_p" in figures else ""
    return f"{name:<28}{label:<30}{cells}{tail}"


def scaled(profile: dict, factor: float) -> dict:
    """The profile with every measured time times ``factor`` (a sensitivity, not a model)."""
    out = copy.deepcopy(profile)
    for tables in out["tp"].values():
        for kind in ("dense", "per_sequence"):
            for name, points in tables[kind].items():
                tables[kind][name] = [[size, t * factor] for size, t in points]
        tables["attention"] = [[*row[:4], row[4] * factor] for row in tables["attention"]]
    return out


def main() -> None:
    heads = "".join(f"{label:>8}" for label in COLUMNS.values())
    print(f"{'run':<28}{'variant':<30}{heads}{'TPOT KS p':>11}")
    for run_dir in sorted(p.parent for p in RUNS.glob("*/*/vllm")):
        run = read_run(run_dir)
        profile = load_profile(None, run)
        name = f"{run.gpu} {run_dir.name}"
        variants = {"full model": run}
        no_prefix = tuple(dataclasses.replace(r, segments=()) for r in run.requests)
        variants["no prefix identity"] = dataclasses.replace(run, requests=no_prefix)
        eager = dataclasses.replace(run.engine, enforce_eager=True)
        variants["eager (no graphs)"] = dataclasses.replace(run, engine=eager)
        flipped = dataclasses.replace(run.engine, async_scheduling=not run.engine.async_scheduling)
        label = "synchronous" if run.engine.async_scheduling else "async scheduling"
        variants[label] = dataclasses.replace(run, engine=flipped)
        if run.means is not None:
            theirs = dataclasses.replace(
                run.engine, max_num_batched_tokens=2048, prefix_caching=False
            )
            variants["2048 tokens, no prefix cache"] = dataclasses.replace(run, engine=theirs)
        for label, variant in variants.items():
            print(line(name, label, errors(variant, profile)))
        unskewed = copy.deepcopy(profile)
        for tables in unskewed["tp"].values():
            tables["skew_alpha"] = {"decode": 0.0, "mixed": 0.0}
        one_alpha = copy.deepcopy(profile)
        for tables in one_alpha["tp"].values():
            tables["skew_alpha"]["decode"] = tables["skew_alpha"]["mixed"]
        if any(any(t["skew_alpha"].values()) for t in profile["tp"].values()):
            print(line(name, "no skew", errors(run, unskewed)))
            print(line(name, "one skew alpha", errors(run, one_alpha)))
        if run.engine.tensor_parallel > 1:
            print(line(name, "no all-reduce", errors(run, profile, allreduce=False)))
        if run.means is not None:
            for factor in (0.9, 1.1):
                label = f"profiled times x {factor:g}"
                print(line(name, label, errors(run, scaled(profile, factor))))


if __name__ == "__main__":
    main()
