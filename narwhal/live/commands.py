"""The live subcommands of ``narwhal``: ``serve`` and ``preflight``.

Rule kept here: handlers only parse arguments, build the live pieces and report; every exit
status is an int (0 success, 1 a check or the server failed, 2 bad configuration or usage).
Heavy imports happen inside the handlers so ``narwhal --help`` stays fast. ``serve``
reloads its configuration file on SIGHUP and when the file changes (:mod:`narwhal.live.reload`).
Both commands take the fleet from ``--config FILE`` or, as vllm-router does, from repeated
``--prefill URL`` and ``--decode URL`` (every other setting at its default; nothing to reload);
either way the configuration is built by :mod:`narwhal.config_file`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

API_KEY_ENV = "NARWHAL_API_KEY"


def register(subparsers: Any) -> None:
    """Add ``serve`` and ``preflight`` to the ``narwhal`` command."""
    serve = subparsers.add_parser("serve", help="run the router in front of the configured fleet")
    add_fleet_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help=f"require 'Authorization: Bearer KEY', KEY read from PATH (or set ${API_KEY_ENV})",
    )
    keys.add_argument(
        "--api-key",
        default=None,
        help="the key itself (visible to every user in `ps`: prefer --api-key-file or "
        f"${API_KEY_ENV})",
    )
    serve.add_argument("--seed", type=int, default=0, help="seed of every policy's randomness")
    serve.add_argument(
        "--log-level", default="warning", help="level of the server's own log on stderr"
    )
    serve.add_argument(
        "--graceful-s",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT, how long requests in flight may finish before they are ended "
        "with a 503 or a terminal SSE error event (default 10)",
    )
    serve.add_argument(
        "--reload-poll-s",
        type=float,
        default=2.0,
        help="how often the configuration file is checked for changes, which are reloaded "
        "as on SIGHUP (default 2; 0: only on SIGHUP)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="router processes sharing the port, each with its own policies "
        "(docs/live.md, Beyond one core; default 1)",
    )
    serve.set_defaults(func=serve_command)

    preflight = subparsers.add_parser(
        "preflight", help="check the engine contract, roles and every KV handoff pair"
    )
    add_fleet_arguments(preflight)
    preflight.add_argument("--seed", type=int, default=0)
    preflight.set_defaults(func=preflight_command)


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The fleet: a configuration file, or engine URLs on the command line."""
    parser.add_argument("--config", default=None, metavar="FILE", help="TOML configuration file")
    for role in ("prefill", "decode"):
        parser.add_argument(
            f"--{role}",
            action="append",
            default=[],
            metavar="URL",
            help=f"a {role} engine's base URL, instead of --config (repeatable; every other "
            "setting at its default)",
        )


def resolve_api_key(flag: str | None, path: str | None, environ: Mapping[str, str]) -> str | None:
    """The key from ``--api-key``, ``--api-key-file`` or the environment, in that order; None
    when none is given. A key given but empty is refused: taken as "no key", it would turn
    authentication off without a word."""
    if path is not None:
        try:
            key, source = Path(path).read_text("utf-8").strip(), f"--api-key-file {path}"
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--api-key-file: cannot read {path}: {error}") from None
    elif flag is not None:
        key, source = flag.strip(), "--api-key"
    elif API_KEY_ENV in environ:
        key, source = environ[API_KEY_ENV].strip(), f"${API_KEY_ENV}"
    else:
        return None
    if not key:
        raise ValueError(f"{source} gives an empty API key (to serve without one, give none)")
    return key


def _load(args: argparse.Namespace) -> Any:
    """The configuration ``--config`` or ``--prefill`` / ``--decode`` give, or None once the
    problem has been told on stderr."""
    from narwhal.config_file import config_from_urls, load_config
    from narwhal.core.config import ConfigError

    urls = bool(args.prefill or args.decode)
    if (args.config is None) == (not urls):
        given = "both" if urls else "neither"
        print(
            f"narwhal {args.command}: give either --config FILE or --prefill URL and --decode URL "
            f"(got {given})",
            file=sys.stderr,
        )
        return None
    try:
        config = (
            load_config(args.config)
            if args.config is not None
            else config_from_urls(args.prefill, args.decode)
        )
        return config
    except ConfigError as error:
        print(f"narwhal: {error}", file=sys.stderr)
        return None


def serve_command(args: argparse.Namespace) -> int:
    from narwhal.live.app import Router
    from narwhal.live.reporting import StdoutRequestLog
    from narwhal.live.serving import make_router_server
    from narwhal.live.workers import serve_workers, startup_note
    from narwhal.serving import bind, port_of

    if args.graceful_s < 0:
        print("narwhal serve: --graceful-s must be >= 0", file=sys.stderr)
        return 2
    if not 0 <= args.reload_poll_s <= 3600:
        print("narwhal serve: --reload-poll-s must be within 0..3600", file=sys.stderr)
        return 2
    config = _load(args)
    if config is None:
        return 2
    try:
        api_key = resolve_api_key(args.api_key, args.api_key_file, os.environ)
    except ValueError as error:
        print(f"narwhal serve: {error}", file=sys.stderr)
        return 2
    if args.workers != 1:  # a supervisor of N router processes (narwhal.live.workers)
        return serve_workers(args, config, api_key)
    if hasattr(signal, "SIGHUP"):  # until the reload loop takes it: not the default (exit)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:  # the server's own messages (narwhal.live's): for people, on stderr
        logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    except ValueError as error:
        print(f"narwhal serve: --log-level: {error}", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as error:
        print(f"narwhal: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print(
        f"narwhal: listening on http://{args.host}:{port_of(sock)} {startup_note(api_key)}; fleet:",
        file=sys.stderr,
        flush=True,
    )
    router = Router(  # stdout carries only the JSON request log; people read stderr
        config,
        seed=args.seed,
        api_key=api_key,
        announce=lambda line: print(line, file=sys.stderr, flush=True),
        # SIGHUP (the server takes SIGINT and SIGTERM only) and changes of the file reload it
        config_path=args.config,
        reload_poll_s=args.reload_poll_s,
        reload_on_sighup=True,
        request_log=StdoutRequestLog(),
    )
    server = make_router_server(router, client=config.client, graceful_s=args.graceful_s)
    server.run([sock])
    return 0


def preflight_command(args: argparse.Namespace) -> int:
    import anyio

    from narwhal.live.preflight import format_table, run_preflight

    config = _load(args)
    if config is None:
        return 2
    rows = anyio.run(lambda: run_preflight(config, seed=args.seed))
    print(format_table(rows))
    return 0 if all(row.passed for row in rows) else 1
