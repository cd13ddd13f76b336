"""Simulator memory against the number of requests: peak RSS of ``narwhal simulate`` for N
requests, each N in a fresh process. Not a test.

The scenario is a large fleet's day in miniature: 16 prefill + 16 decode engines (Llama-3-8B on
H200), the Azure conversation trace (AzurePublicDataset, CC-BY-4.0) looped and compressed 70x
(about 380 requests a second offered), crashes, hangs, slow engines, stalling streams and in-band
errors at compressed rates, the decision log on (as ``narwhal simulate`` runs by default). Only
``max_requests`` changes between runs, so a run of 10x the requests covers 10x the simulated
time. ``narwhal simulate`` streams its records, timeline and decisions to disk, so its peak RSS
should not grow with N; the script prints each run's peak RSS (the child's own
``ru_maxrss``, from ``os.wait4``), wall time, and the ratio of the largest N's RSS to the
smallest's. ``--held`` runs the same scenario held in memory instead (``run`` without
``stream_to``, then ``write``: what the tests and sweeps do), for comparison.

    .venv/bin/python benchmarks/simulator/sim_memory.py [--requests 200000 2000000] [--held] \
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the same fault mix and router settings (this folder is on sys.path when run)
from sim_speed import FAULTS, ROUTER

REPO = Path(__file__).resolve().parents[2]

SCENARIO = (
    """
name = "sim-memory"
"""
    + ROUTER
    + """[fleet]
prefill = 16
decode = 16
model = "llama3-8b"
max_num_seqs = 256
max_num_batched_tokens = 2048
stream_interval = 16
[workload]
kind = "trace"
trace = "azure2023_conv"
rate_scale = {rate_scale}
repeat = true
max_requests = {requests}
[sim]
seed = 1
sample_interval_s = 5.0
max_sim_s = 1e9
"""
    + FAULTS
)


HELD = """
import gc, sys, time
from pathlib import Path
from narwhal.sim.commands import GC_THRESHOLDS
from narwhal.sim.results import write
from narwhal.sim.runner import run
from narwhal.sim.scenario import load_scenario
gc.set_threshold(*GC_THRESHOLDS)
result = run(load_scenario(sys.argv[1]))
write(result, Path(sys.argv[2]))
print(f"{len(result.records)} requests held in memory, {result.wall_s:.1f} s wall")
"""


def measure(
    requests: int, rate_scale: float, folder: Path, held: bool = False
) -> tuple[int, float, str]:
    """Peak RSS (KiB), wall seconds and the summary line of one ``narwhal simulate`` run."""
    scenario = folder / f"sim-memory-{requests}.toml"
    scenario.write_text(SCENARIO.format(requests=requests, rate_scale=rate_scale), "utf-8")
    out = folder / f"out-{requests}"
    command = [sys.executable, "-c", HELD, str(scenario), str(out)]
    if not held:
        simulate = ["-m", "narwhal.cli", "simulate", str(scenario), "--out", str(out)]
        command = [sys.executable, *simulate, "--no-plot", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    printed = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"narwhal simulate failed for {requests} requests:\n{printed}")
    last = printed.strip().splitlines()[-1]
    return usage.ru_maxrss, wall, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--rate-scale", type=float, default=70.0)
    parser.add_argument("--keep", type=Path, help="keep the scenarios and results here")
    parser.add_argument("--held", action="store_true", help="hold the run in memory instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        peaks = []
        for requests in sorted(args.requests):
            rss, wall, last = measure(requests, args.rate_scale, folder, args.held)
            peaks.append(rss)
            print(
                f"{requests:>10,} requests: peak RSS {rss / 1024:7.1f} MiB, wall {wall:7.1f} s "
                f"({last})",
                flush=True,
            )
    if len(peaks) > 1:
        ratio = peaks[-1] / peaks[0]
        print(f"RSS at {max(args.requests):,} / at {min(args.requests):,}: {ratio:.3f}")


if __name__ == "__main__":
    main()
