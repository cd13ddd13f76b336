"""A router's resident memory while it serves one request after another: a leak shows as RSS
that keeps growing once the router's bounded stores are full. Not a test.

    .venv/bin/python benchmarks/router/router_rss.py                                   # pure build
    .venv/bin/python benchmarks/router/router_rss.py --narwhal-bin .venv-compiled/bin/narwhal

The engines and Narwhal's settings are ``benchmarks/router/routers.py``'s (one producer, one
consumer, every timing 0); ``--rounds`` rounds of ``--requests`` streamed completions of
``--tokens`` tokens, one at a time, and the router's RSS (``/proc/<pid>/status``) after each round.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_instructions  # this folder's: how routers.py starts Narwhal, and the load
from bench_routers import NARWHAL, NARWHAL_BIN, RouterSpec, wait_router
from bench_stack import Stack, start_fleet


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--narwhal-bin", type=Path, default=NARWHAL)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=1)
    args = parser.parse_args()
    NARWHAL_BIN["path"] = args.narwhal_bin.absolute()
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-rss-"))
    stack = Stack(workdir)
    try:
        fleet = start_fleet(stack, "rss", 1, 1, 0.0)
        argv, url = router_instructions.router_argv("narwhal", fleet, workdir)
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_router(RouterSpec("narwhal", url, argv, ""), 60)
            for round_ in range(1, args.rounds + 1):
                router_instructions.stream_completions(url, args.requests, args.tokens, 60)
                served = round_ * args.requests
                print(f"{served:>7} requests: RSS {rss_kib(proc.pid):,} KiB", flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    finally:
        stack.stop_all()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("router_rss"):
        main()
