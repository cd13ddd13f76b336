"""Simulator speed as `narwhal simulate` runs: records streamed to disk, nothing of a finished
request kept, on sim_speed.py's scenario (8+8 engines, faults, Azure trace at 35x).

    .venv-compiled/bin/python benchmarks/simulator/sim_speed_streamed.py --requests 1000000

Prints the CPU rate of every ``--window`` finished requests (whether a long run slows down) and
the whole run's wall and CPU rates. sim_speed.py measures the same scenario held in memory.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from sim_speed import build, scenario_for

from narwhal.core.records import DecisionLog
from narwhal.sim.commands import GC_THRESHOLDS  # as `narwhal simulate` runs
from narwhal.sim.runner import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--stream-interval", type=int, default=1)
    parser.add_argument("--window", type=int, default=100_000)
    args = parser.parse_args()
    if args.requests < 1 or args.window < 1:
        parser.error("--requests and --window must be at least 1")
    gc.set_threshold(*GC_THRESHOLDS)
    scenario = scenario_for(args.requests, args.stream_interval, 16, 35.0)
    marks = [time.process_time()]

    def progress(finished: int, total: int) -> None:
        if finished % args.window == 0:
            marks.append(time.process_time())
            rate = args.window / (marks[-1] - marks[-2])
            print(f"requests {finished - args.window:,}-{finished:,}: {rate:,.0f} per CPU s")

    with tempfile.TemporaryDirectory() as out:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        run(scenario, log=DecisionLog(enabled=False), progress=progress, stream_to=Path(out))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(
        f"[{build()} build] {args.requests:,} requests streamed, stream_interval "
        f"{args.stream_interval}: {args.requests / wall:,.0f} per wall s, "
        f"{args.requests / cpu:,.0f} per CPU s"
    )


if __name__ == "__main__":
    main()
