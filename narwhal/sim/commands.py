"""``narwhal simulate [SCENARIO.toml] [--seed N] [--out DIR]`` and ``narwhal replay LOG
[--out SCENARIO.toml]`` (:mod:`narwhal.sim.replay`).

Rule kept here: the command only reads a scenario, runs it and writes results; the default
scenario is embedded (``narwhal/sim/scenarios/default.toml``), so the command works with no
arguments. Heavy imports happen inside the handler so ``narwhal --help`` stays fast. The
command, not the library, sets the process's garbage-collector thresholds for the length of
its run (:data:`GC_THRESHOLDS`; docs/simulator.md, Performance rules).
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

GC_THRESHOLDS = (100_000, 50, 100)
"""The cyclic collector's thresholds for a simulation run (Python's default: 700, 10, 10)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="simulate a faulty GPU fleet behind Narwhal's policies (SimPy)",
        description=(
            "Run a scenario (router config + [fleet] + [workload] + [[faults]] + [sim]) through "
            "the simulator, print a summary table and write records, timelines, the decision "
            "log and a plot. With no scenario, runs the embedded default."
        ),
    )
    parser.add_argument("scenario", nargs="?", help="scenario TOML file (default: embedded)")
    parser.add_argument("--seed", type=int, default=None, help="override [sim].seed")
    parser.add_argument("--out", default="narwhal-out", help="output folder (./narwhal-out)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (by default one appears on stderr once a run takes over 2 s)",
    )
    parser.add_argument(
        "--print-default", action="store_true", help="print the embedded default scenario and exit"
    )
    parser.set_defaults(func=_simulate)
    replay = subparsers.add_parser(
        "replay",
        help="write a scenario that replays a router's request log, faults included",
        description=(
            "Read `narwhal serve`'s JSON request log (its stdout) and write a scenario that "
            'replays it: its requests as [workload] kind = "log", its fleet and router '
            "settings, and the engine failures the router saw as [[faults]], each commented "
            "with the log lines it comes from. Simulate or sweep the scenario to ask what other "
            "settings would have done with the same traffic and faults."
        ),
    )
    replay.add_argument("log", help="the request log (JSON lines)")
    replay.add_argument("--out", default=None, help="write the scenario here (default: stdout)")
    replay.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from narwhal.sim.replay import replay_scenario
    from narwhal.sim.request_log import LogError
    from narwhal.sim.scenario import ScenarioError

    try:
        replay = replay_scenario(args.log)
    except (LogError, ScenarioError) as error:
        print(f"narwhal replay: {error}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(replay.text)
    else:
        Path(args.out).write_text(replay.text, "utf-8")
    ejected = ", ".join(replay.history.ejected) or "none"
    print(
        f"narwhal replay: {len(replay.log.requests)} requests, {len(replay.roles)} engines, "
        f"{replay.faults} faults; ejected in the log: {ejected}"
        + (f"; scenario in {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from narwhal.sim.scenario import ScenarioError, default_scenario_text, load_scenario

    if args.print_default:
        sys.stdout.write(default_scenario_text())
        return 0
    try:
        scenario = load_scenario(args.scenario)
    except (ScenarioError, ValueError) as error:
        print(f"narwhal simulate: {error}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    from narwhal.sim.faults import describe
    from narwhal.sim.results import table, write
    from narwhal.sim.runner import run

    # delay: a run of a few seconds (the default scenario) prints nothing but its summary
    out = Path(args.out)
    saved = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with tqdm(
            desc="simulate", unit="req", file=sys.stderr, delay=2.0, disable=args.no_progress
        ) as bar:

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            # streamed: memory stays flat however many requests the run has
            result = run(scenario, args.seed, progress=progress, stream_to=out)
    except ValueError as error:
        print(f"narwhal simulate: {error}", file=sys.stderr)
        return 2
    finally:
        gc.set_threshold(*saved)  # the handler may run inside another program (tests)
    summary = write(result, out)
    if not args.no_plot:  # reads the files back: its memory grows with the run's requests
        from narwhal.sim.plot import plot_files

        plot_files(result, summary, out)
    sys.stdout.write(table(summary))
    rate = result.finished / result.wall_s if result.wall_s > 0 else 0.0
    print(
        f"\n{result.finished} requests simulated in {result.wall_s:.1f} s wall "
        f"({rate:,.0f} req/s); results in {out}/"
    )
    for fault in result.unrun_faults:
        print(
            f"narwhal simulate: warning: the fault {describe(fault)} never happened: the run "
            f"ended at {result.sim_end_s:g} s (it is not in faults.csv)",
            file=sys.stderr,
        )
    if summary["unfinished"]:
        print(
            f"narwhal simulate: warning: {summary['unfinished']} of {summary['requests']} requests "
            f"had not finished when the run stopped at sim.max_sim_s = "
            f"{scenario.sim.max_sim_s:g} s (outcome 'unfinished' in records.csv)",
            file=sys.stderr,
        )
    return 0
