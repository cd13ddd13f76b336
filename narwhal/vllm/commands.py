"""The real-engine subcommands of ``narwhal``: ``calibrate``.

Rule kept here: the handler only parses arguments and reports; the measuring and the fit live in
:mod:`narwhal.vllm.calibrate` (HTTP only: it works against any OpenAI-compatible vLLM, and the
project venv needs no torch). Exit status 0 on success, 1 when an engine could not be measured,
2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    if len(set(values)) < 2:
        raise argparse.ArgumentTypeError(f"need at least two different values to fit: {text!r}")
    return values


def counts_problem(repeats: int, tokens: int) -> str | None:
    """What is wrong with a calibration's ``--repeats`` and ``--tokens`` (None: nothing)."""
    if repeats < 1 or tokens < 8:
        return "--repeats must be >= 1 and --tokens >= 8"
    return None


def _writable(path: Path | None) -> str | None:
    """Why ``path`` cannot be written after the measuring (None: it can)."""
    if path is None:
        return None
    if path.is_dir():
        return f"{path} is a directory"
    if not path.parent.is_dir():
        return f"no such directory: {path.parent}"
    return None


def register(subparsers: Any) -> None:
    """Add ``calibrate`` to the ``narwhal`` command."""
    calibrate = subparsers.add_parser(
        "calibrate",
        help="measure a live vLLM engine and fit the simulator's linear timing",
        description="Measure a live OpenAI-compatible vLLM engine over HTTP (prefill time vs "
        "prompt length; decode step time vs concurrent streams; with --decode-engine, the KV "
        "pull of real handoffs) and fit the simulator's [fleet.linear] timing. Prints every "
        "point against the model, the parameters and the fit error; --out writes a scenario "
        "[fleet] snippet (TOML).",
    )
    calibrate.add_argument("--engine", required=True, help="engine base URL (the prefill side)")
    calibrate.add_argument(
        "--decode-engine",
        default=None,
        help="decode engine base URL (a kv_consumer paired with --engine); default --engine",
    )
    calibrate.add_argument("--out", type=Path, help="write the [fleet] TOML snippet here")
    calibrate.add_argument("--json", type=Path, help="also write every sample and the fit (JSON)")
    calibrate.add_argument("--model", default=None, help="model name (default: GET /v1/models)")
    calibrate.add_argument(
        "--lengths",
        type=int_list,
        default=None,
        help="prompt lengths in characters (default 16,128,384,768,1280)",
    )
    calibrate.add_argument(
        "--batches",
        type=int_list,
        default=None,
        help="concurrent decode streams (default 1,2,4,8,16)",
    )
    calibrate.add_argument("--repeats", type=int, default=3, help="runs per point")
    calibrate.add_argument(
        "--statistic",
        choices=["median", "min"],
        default="median",
        help="how a point's repeats are reduced (default median: the typical time; min: the "
        "least disturbed by other work on the machine)",
    )
    calibrate.add_argument("--tokens", type=int, default=48, help="tokens per decode stream")
    calibrate.add_argument("--seed", type=int, default=0)
    calibrate.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    import httpx

    from narwhal.vllm.calibrate import (
        DEFAULT_BATCHES,
        DEFAULT_LENGTHS,
        calibrate_engine,
        engine_json,
        engine_report,
    )

    problem = counts_problem(args.repeats, args.tokens)
    if problem is not None:
        print(f"calibrate: {problem}", file=sys.stderr)
        return 2
    for flag, path in (("--out", args.out), ("--json", args.json)):
        problem = _writable(path)
        if problem is not None:  # found now, not after minutes of measuring
            print(f"calibrate: {flag}: {problem}", file=sys.stderr)
            return 2
    try:
        result = calibrate_engine(
            args.engine.rstrip("/"),
            args.decode_engine.rstrip("/") if args.decode_engine else None,
            model=args.model,
            lengths=args.lengths or DEFAULT_LENGTHS,
            batches=args.batches or DEFAULT_BATCHES,
            repeats=args.repeats,
            tokens=args.tokens,
            seed=args.seed,
            statistic=args.statistic,
        )
    except (httpx.HTTPError, RuntimeError, KeyError, IndexError, ValueError) as error:
        print(f"calibrate: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(engine_report(result))
    try:
        if args.json:
            args.json.write_text(json.dumps(engine_json(result), indent=1) + "\n", "utf-8")
        if args.out:
            args.out.write_text(result.toml(), encoding="utf-8")
            print(f"[fleet] snippet: {args.out}")
    except OSError as error:  # the report above keeps the measurements
        print(f"calibrate: cannot write: {error}", file=sys.stderr)
        return 1
    return 0
