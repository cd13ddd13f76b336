"""``narwhal sweep SPEC.toml [--out DIR] [--seed N] [--workers N] [--ray ADDRESS] [--quick]``
(plus ``--check``, ``--redraw``, ``--resume``, ``--no-progress``).

Rule kept here: the command reads a sweep spec, runs it and writes its files; a spec that is
refused prints every bad key and exits 2 before anything runs. Heavy imports (the simulator,
matplotlib, Ray) happen inside the handler so ``narwhal --help`` stays fast.

Theory of operation: see :mod:`narwhal.experiments` and docs/experiments.md. ``--workers 0``
runs every simulation in this process; the default fans out over local processes (one per CPU);
``--ray ADDRESS`` (``local`` for a private local Ray, ``auto``, ``ray://host:port``) runs them
on Ray. Results are identical whichever runs them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="run a grid of simulations and draw the tuning / retries / capacity figures",
        description=(
            "Run a sweep spec (a base scenario + a grid of overrides + replicate seeds + a "
            "figure recipe) over local processes or a Ray cluster; writes runs.csv, points.csv, "
            "sweep.json and the recipe's PNGs, each with a CSV beside it. See "
            "docs/experiments.md."
        ),
    )
    parser.add_argument("spec", help="sweep spec TOML (e.g. experiments/tuning.toml)")
    parser.add_argument("--out", default=None, help="output folder (default: sweep-out/<name>)")
    parser.add_argument("--seed", type=int, default=None, help="override [sweep].seed")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="local processes (default: one per CPU; 0 = run in this process)",
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="run on Ray: 'local' starts one here, or 'auto' / 'ray://head:10001' "
        "(needs the ray extra: pip install 'narwhal-router[ray]')",
    )
    parser.add_argument("--quick", action="store_true", help="the spec's [quick] version (tests)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--check", action="store_true", help="validate the spec and print the plan; run nothing"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted sweep: keep the runs --out's journal holds, run the rest",
    )
    parser.add_argument(
        "--redraw",
        action="store_true",
        help="redraw the figures from --out's runs.csv (no simulation; not for per-request CDFs)",
    )
    parser.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from narwhal.experiments.journal import JOURNAL_NAME, load_journal
    from narwhal.experiments.spec import SpecError, load_spec
    from narwhal.experiments.sweep import check_out, finish, prepare, run_sweep, write_sweep

    if args.workers is not None and args.workers < 0:
        print("narwhal sweep: --workers must be >= 0", file=sys.stderr)
        return 2
    try:
        spec = load_spec(args.spec)
        plan = prepare(spec, seed=args.seed, quick=args.quick)
    except SpecError as error:
        print(f"narwhal sweep: {error}", file=sys.stderr)
        return 2
    name = plan.spec.sweep.name
    print(
        f"sweep {name}: {len(plan.points)} points x {plan.spec.sweep.replicates} replicates = "
        f"{len(plan.tasks)} runs (seed {plan.spec.sweep.seed}{', quick' if args.quick else ''})",
        file=sys.stderr,
    )
    if args.check:
        for point in plan.points:
            print(f"  point {point.index}: {point.label()}")
        return 0
    out = Path(args.out) if args.out else Path("sweep-out") / name
    try:
        check_out(out)
    except ValueError as error:
        print(f"narwhal sweep: {error}", file=sys.stderr)
        return 2
    if args.redraw:
        from narwhal.experiments.sweep import redraw

        try:
            result = redraw(spec, out, seed=args.seed, quick=args.quick)
        except ValueError as error:
            print(f"narwhal sweep: --redraw: {error}", file=sys.stderr)
            return 2
        for path in write_sweep(result, out):
            print(f"  {path}")
        _print_recommendation(out)
        return 0
    from narwhal.experiments.backends import BackendError

    started = time.perf_counter()
    try:
        result = run_sweep(
            spec,
            seed=args.seed,
            quick=args.quick,
            workers=args.workers,
            ray_address=args.ray,
            progress=not args.no_progress,
            journal_dir=out,
            resume=args.resume,
        )
    except (BackendError, ValueError) as error:
        print(f"narwhal sweep: {error}", file=sys.stderr)
        return 1 if isinstance(error, BackendError) else 2
    except KeyboardInterrupt:
        journal = out / JOURNAL_NAME
        kept = len(load_journal(journal, plan.tasks))
        print(
            f"\nnarwhal sweep: interrupted; {kept} of {len(plan.tasks)} runs are kept in "
            f"{journal}: add --resume to the same command to run the rest",
            file=sys.stderr,
        )
        return 130
    from narwhal.experiments.aggregate import unrun_faults

    for index, fault, missed, total in unrun_faults(result):
        print(
            f"narwhal sweep: warning: faults[{index}] ({fault.get('kind')} at "
            f"{fault['at_s']:g} s) never happened in {missed} of {total} runs: they ended "
            "first (the figures say so)",
            file=sys.stderr,
        )
    written = write_sweep(result, out)
    finish(out)
    wall = time.perf_counter() - started
    print(
        f"{len(result.plan.tasks)} runs, {result.requests:,} simulated requests in {wall:.1f} s "
        f"wall ({result.requests / wall:,.0f} req/s); wrote {len(written)} files to {out}/"
    )
    for path in written:
        print(f"  {path}")
    _print_recommendation(out)
    return 0


def _print_recommendation(out: Path) -> None:
    """The recommendation's verdict, as written to ``recommendation.json``."""
    import json

    advice = json.loads((out / "recommendation.json").read_text("utf-8"))
    print(f"recommendation: {advice['reason']}")
