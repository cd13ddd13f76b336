"""The emulator's subcommand of ``narwhal``: ``emulate``, one emulated vLLM engine with faults.

Rule kept here: the handler only parses arguments, builds the emulator and serves it in the
foreground; every exit status is an int (0 after a clean stop, 1 when it cannot listen, 2 for a
bad fault or side channel). Heavy imports happen inside the handler so ``narwhal --help`` stays
fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``emulate`` to the ``narwhal`` command."""
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
        help="KIND[:key=value,...], repeatable; KIND from the fault vocabulary "
        "(narwhal.core.injected_faults, docs/live.md); count=K, phase=P and probability=F "
        "choose the requests it strikes (probabilities drawn from --seed)",
    )
    emulate.add_argument("--prefill-s-per-token", type=float, default=0.0002)
    emulate.add_argument("--decode-s-per-token", type=float, default=0.002)
    emulate.add_argument("--kv-s-per-token", type=float, default=0.00001)
    emulate.add_argument("--overhead-s", type=float, default=0.001)
    emulate.add_argument("--block-size", type=int, default=16)
    emulate.add_argument("--kv-lease-s", type=float, default=30.0)
    emulate.add_argument("--kv-load-failure-policy", choices=["fail", "recompute"], default="fail")
    emulate.add_argument(
        "--no-enable-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="no prefix cache (vLLM's flag of that name; on by default, as in vLLM)",
    )
    emulate.add_argument(
        "--prefix-cache-blocks", type=int, default=16384, help="the prefix cache's bound (LRU)"
    )
    emulate.add_argument(
        "--kv-events-port",
        type=int,
        default=None,
        help="publish the prefix cache's KV events as vLLM's --kv-events-config does (ZMQ PUB "
        "on this port of --host, 0: a free one; a replay ROUTER on a free port)",
    )
    emulate.add_argument("--kv-events-topic", default="")
    emulate.add_argument("--engine-id", default=None)
    emulate.add_argument("--seed", type=int, default=0)
    emulate.add_argument("--log-level", default="warning")
    emulate.set_defaults(func=emulate_command)


def emulate_command(args: argparse.Namespace) -> int:
    from narwhal.core.config import Role
    from narwhal.core.descriptor import parse_side_channel
    from narwhal.emulator.faults import FaultError, parse_fault
    from narwhal.emulator.runner import build_emulator
    from narwhal.emulator.state import EmulatorConfig
    from narwhal.emulator.timing import LinearTiming
    from narwhal.serving import serve_blocking

    try:
        faults = [parse_fault(spec) for spec in args.fault]
        side = parse_side_channel(args.kv_side_channel) if args.kv_side_channel else None
    except (FaultError, ValueError) as error:
        print(f"narwhal emulate: {error}", file=sys.stderr)
        return 2
    if args.prefix_cache_blocks < 1:
        print(
            f"narwhal emulate: --prefix-cache-blocks must be at least 1, got "
            f"{args.prefix_cache_blocks}",
            file=sys.stderr,
        )
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
        prefix_caching=args.prefix_caching,
        prefix_cache_blocks=args.prefix_cache_blocks,
        seed=args.seed,
        kv_events_port=args.kv_events_port,
        kv_events_topic=args.kv_events_topic,
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
    if built.app.kv_events is not None:
        print(
            f"KV events on {built.app.kv_events.endpoint}, replay on "
            f"{built.app.kv_events.replay_endpoint}",
            flush=True,
        )
    serve_blocking(built.server, built.sockets)
    return 0
