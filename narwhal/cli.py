"""The ``narwhal`` command: subcommands are registered by the parts that own them.

Each part (``narwhal.live.commands``, ``narwhal.sim.commands``, ...) exposes
``register(subparsers)`` adding its subcommands, each with ``func(args) -> int`` as its default.
Heavy imports happen inside the handlers, so ``narwhal --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "narwhal.sim.commands",
    "narwhal.live.commands",
    "narwhal.emulator.commands",
    "narwhal.experiments_cli",
    "narwhal.vllm.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="narwhal",
        description="Router for disaggregated LLM serving, and a simulator of faulty GPU fleets.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
