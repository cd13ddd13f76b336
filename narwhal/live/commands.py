"""The live subcommands of ``narwhal``: ``serve``, ``preflight`` and ``emulate``.

Rule kept here: handlers only parse arguments, build the live pieces and report; every exit
status is an int (0 success, 1 a check or the server failed, 2 bad configuration or usage).
Heavy imports happen inside the handlers so ``narwhal --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

API_KEY_ENV = "NARWHAL_API_KEY"


def register(subparsers: Any) -> None:
    """Add ``serve``, ``preflight`` and ``emulate`` to the ``narwhal`` command."""
    serve = subparsers.add_parser("serve", help="run the router in front of the configured fleet")
    serve.add_argument("--config", required=True, help="TOML configuration file")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--api-key", default=None, help=f"require 'Authorization: Bearer KEY' (or ${API_KEY_ENV})"
    )
    serve.add_argument("--seed", type=int, default=0, help="seed of every policy's randomness")
    serve.add_argument("--log-level", default="warning", help="uvicorn's log level")
    serve.add_argument(
        "--graceful-s",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT, how long requests in flight may finish before they are ended "
        "with a 503 or a terminal SSE error event (default 10)",
    )
    serve.set_defaults(func=serve_command)

    preflight = subparsers.add_parser(
        "preflight", help="check the engine contract, roles and every KV handoff pair"
    )
    preflight.add_argument("--config", required=True, help="TOML configuration file")
    preflight.add_argument("--seed", type=int, default=0)
    preflight.set_defaults(func=preflight_command)

    emulate = subparsers.add_parser("emulate", help="run an emulated vLLM engine with faults")
    emulate.add_argument("--port", type=int, required=True, help="HTTP port (0: pick a free one)")
    emulate.add_argument("--host", default="127.0.0.1")
    emulate.add_argument("--role", choices=["prefill", "decode", "both"], default="both")
    emulate.add_argument("--model", default="tiny-llama", help="served model name")
    emulate.add_argument("--version", default="0.32.0", help="vLLM version reported")
    emulate.add_argument(
        "--kv-side-channel",
        default=None,
        metavar="HOST:PORT",
        help="where the KV blocks are served (default: the host, a free port)",
    )
    emulate.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND[:key=value,...], repeatable (see docs/live.md)",
    )
    emulate.add_argument("--prefill-s-per-token", type=float, default=0.0002)
    emulate.add_argument("--decode-s-per-token", type=float, default=0.002)
    emulate.add_argument("--kv-s-per-token", type=float, default=0.00001)
    emulate.add_argument("--overhead-s", type=float, default=0.001)
    emulate.add_argument("--block-size", type=int, default=16)
    emulate.add_argument("--kv-lease-s", type=float, default=30.0)
    emulate.add_argument("--kv-load-failure-policy", choices=["fail", "recompute"], default="fail")
    emulate.add_argument("--engine-id", default=None)
    emulate.add_argument("--seed", type=int, default=0)
    emulate.add_argument("--log-level", default="warning")
    emulate.set_defaults(func=emulate_command)


def _load(path: str) -> Any:
    from narwhal.config_file import load_config
    from narwhal.core.config import ConfigError

    try:
        return load_config(path)
    except ConfigError as error:
        print(f"narwhal: {error}", file=sys.stderr)
        return None


def serve_command(args: argparse.Namespace) -> int:
    from narwhal.live.app import Router
    from narwhal.live.serving import bind, make_router_server, port_of, serve_blocking

    if args.graceful_s < 0:
        print("narwhal serve: --graceful-s must be >= 0", file=sys.stderr)
        return 2
    config = _load(args.config)
    if config is None:
        return 2
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    requests_log = logging.getLogger("narwhal.requests")
    requests_log.addHandler(handler)
    requests_log.setLevel(logging.INFO)
    requests_log.propagate = False
    try:
        sock = bind(args.host, args.port)
    except OSError as error:
        print(f"narwhal: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print(
        f"narwhal: listening on http://{args.host}:{port_of(sock)} "
        f"(api key {'required' if api_key else 'off'}); fleet:",
        flush=True,
    )
    router = Router(
        config, seed=args.seed, api_key=api_key, announce=lambda line: print(line, flush=True)
    )
    server = make_router_server(router.app, log_level=args.log_level, graceful_s=args.graceful_s)
    serve_blocking(server, [sock])
    return 0


def preflight_command(args: argparse.Namespace) -> int:
    import anyio

    from narwhal.live.preflight import format_table, run_preflight

    config = _load(args.config)
    if config is None:
        return 2
    rows = anyio.run(lambda: run_preflight(config, seed=args.seed))
    print(format_table(rows))
    return 0 if all(row.passed for row in rows) else 1


def emulate_command(args: argparse.Namespace) -> int:
    from narwhal.core.config import Role
    from narwhal.core.descriptor import parse_side_channel
    from narwhal.live.emulator.app import EmulatorConfig
    from narwhal.live.emulator.faults import FaultError, parse_fault
    from narwhal.live.emulator.runner import build_emulator
    from narwhal.live.emulator.timing import LinearTiming
    from narwhal.live.serving import serve_blocking

    try:
        faults = [parse_fault(spec) for spec in args.fault]
        side = parse_side_channel(args.kv_side_channel) if args.kv_side_channel else None
    except (FaultError, ValueError) as error:
        print(f"narwhal emulate: {error}", file=sys.stderr)
        return 2
    config = EmulatorConfig(
        role=Role(args.role),
        model=args.model,
        version=args.version,
        host=args.host,
        port=args.port,
        engine_id=args.engine_id,
        block_size=args.block_size,
        kv_lease_s=args.kv_lease_s,
        kv_load_failure_policy=args.kv_load_failure_policy,
        seed=args.seed,
        timing=LinearTiming(
            prefill_s_per_token=args.prefill_s_per_token,
            decode_s_per_token=args.decode_s_per_token,
            kv_s_per_token=args.kv_s_per_token,
            overhead_s=args.overhead_s,
        ),
    )
    try:
        built = build_emulator(config, faults, side_channel=side, log_level=args.log_level)
    except OSError as error:
        print(f"narwhal emulate: cannot listen: {error}", file=sys.stderr)
        return 1
    print(
        f"emulated vLLM {args.version} ({args.role}) serving {args.model} on {built.url}; "
        f"KV side channel {built.side_channel}; engine id {built.app.engine_id}",
        flush=True,
    )
    serve_blocking(built.server, built.sockets)
    return 0
