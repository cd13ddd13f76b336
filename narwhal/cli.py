"""The ``narwhal`` command: subcommands are registered by the packages that own them.

Rule kept here: this module knows only the list of ``commands`` modules; each package's
``commands`` module (``narwhal.sim.commands``, ``narwhal.live.commands``, ...) exposes
``register(subparsers)`` adding its subcommands, each with ``func(args) -> int`` as its default.
Building the parser imports nothing outside the standard library (the handlers import what
they need), so ``narwhal --help`` stays fast and ``python3 -m narwhal.cli vllm setup`` runs on
a bare Python, before any venv exists.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from narwhal import __version__

# What the ``sim`` extra installs: a router-only install lacks them, and a subcommand that needs
# one says how to get it instead of showing a traceback.
SIM_EXTRA_MODULES = frozenset({"simpy", "matplotlib", "tqdm", "scipy", "yaml"})

COMMAND_MODULES = (
    "narwhal.sim.commands",
    "narwhal.sim.validation.commands",
    "narwhal.live.commands",
    "narwhal.emulator.commands",
    "narwhal.experiments.commands",
    "narwhal.vllm.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="narwhal",
        description="Router for disaggregated LLM serving, and a simulator of faulty GPU fleets.",
    )
    parser.add_argument("--version", action="version", version=f"narwhal {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
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
    except ModuleNotFoundError as error:
        if error.name not in SIM_EXTRA_MODULES:
            raise
        print(
            f"narwhal {args.command}: needs {error.name}, part of the simulator's extra: "
            "pip install 'narwhal-router[sim]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
