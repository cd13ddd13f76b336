"""Narwhal side by side with the P/D routers users would pick instead, in one run.

Usage (from the repository root; the peers live in their own venv, see setup_peers.sh here):

    .venv/bin/python benchmarks/router/routers.py [--quick] [--profile] [--narwhal-nodelay] \
        [--only ...]

Routers: Narwhal (``narwhal serve``), vllm-router 0.1.17 (``--vllm-pd-disaggregation``),
smg 1.13.0 (``smg launch --pd-disaggregation``, workers from a file manifest naming the
NixlConnector), a naive Starlette + httpx proxy (naive_proxy.py, beside this file) and a
logic-free relay on aiohttp and uvloop (aiohttp_relay.py: the floor of Narwhal's own HTTP stack).
Every engine is ``narwhal emulate`` with all timing set to zero, on 127.0.0.1, started through
nodelay.py (TCP_NODELAY on its connections, as a real vLLM has). docs/benchmarks.md
explains the method and the results.

Phases:
1. Overhead: one producer + one consumer shared by all four routers at once. Time to first token
   is measured at concurrency 1, the targets interleaved request by request (so background load
   hits all of them alike), against two baselines: decode-only straight to the consumer (the
   issue's baseline), and the same P/D handoff done by the client itself. Throughput: closed-loop
   streams (64 tokens) and one-token requests, rounds alternating between routers; the router's
   CPU time (all processes of its process group, from /proc) per streamed token chunk and per
   request, and the consumer connections the router closed.
2. Fault goodput: per router a fresh fleet of 2 producers and 5 consumers; after warm-up three
   consumers turn bad (hang before the first token; stall after 3 tokens; ``[DONE]`` before any
   token) and one producer is SIGKILLed 2 s into an open-loop load. Each response is compared with
   the emulator's deterministic text: ok, error (non-200, transport error or an in-band error
   event), wrong-but-200 (200, no error signalled, text not the expected one), hung (not finished
   at the bound).

The load generator is bench_loadgen.py in its own process (aiohttp, uvloop), driven
over stdin/stdout with JSON lines. Each router runs on a core of its own, the engines and the load
generator on the others (cores.py; ``--no-pin`` leaves them to the scheduler).
Results go to benchmarks/results/routers-<stamp>.{json,csv}. ``--profile`` also records
Narwhal with py-spy under two loads and prints where its time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cores  # this folder's: which core each process runs on
from bench_loadgen import loadgen_main
from bench_phases import Settings, phase_faults, phase_overhead
from bench_profile import phase_profile
from bench_report import report, write_csv
from bench_routers import (
    COMPILED,
    EXTRA,
    NARWHAL,
    NARWHAL_BIN,
    NARWHAL_COMPILED,
    PEER_POLICY,
    ROUTERS,
)
from bench_stack import PEERS_BIN, PY, RESULTS, ROOT, LoadGen, Stack

# The benchmark's modules, each one job (all in this folder): bench_stack (processes, the
# emulated fleet, paths), bench_loadgen (the load generator child), bench_routers (how each
# router starts), bench_phases (overhead and fault goodput), bench_profile (py-spy),
# bench_report (the tables and the CSV).


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        # which interpreter build ran every Python process (one venv's): a distribution's
        # optimised build (PGO + LTO, as the container's) and a plain source build differ
        "python_prefix": sys.base_prefix,
        "python_config_args": sysconfig.get_config_var("CONFIG_ARGS"),
        "kernel": platform.release(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


# ====================================================================== main


def check_tools(names: list[str], profile: bool, compiled: bool) -> None:
    missing = [str(p) for p in (PY, NARWHAL_BIN["path"]) if not p.exists()]
    if compiled and not NARWHAL_COMPILED.exists():
        missing.append(f"{NARWHAL_COMPILED} (bash scripts/build_compiled.sh)")
    if "vllm-router" in names and not (PEERS_BIN / "vllm-router").exists():
        missing.append(str(PEERS_BIN / "vllm-router"))
    if "smg" in names and not (PEERS_BIN / "smg").exists():
        missing.append(str(PEERS_BIN / "smg"))
    if profile and not (PEERS_BIN / "py-spy").exists():
        missing.append(str(PEERS_BIN / "py-spy"))
    if missing:
        sys.exit(
            "missing: " + ", ".join(missing) + "\nrun: bash benchmarks/router/setup_peers.sh "
            "(installs vllm-router, smg and py-spy into benchmarks/router/.venv-peers)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (about 2 minutes)")
    parser.add_argument("--profile", action="store_true", help="also py-spy Narwhal under load")
    parser.add_argument("--profile-only", action="store_true", help="only the py-spy profile")
    parser.add_argument("--only", nargs="+", choices=ROUTERS, help="a subset of the routers")
    parser.add_argument(
        "--narwhal-nodelay",
        action="store_true",
        help=f"phase 1 also measures {EXTRA}: Narwhal with TCP_NODELAY (see nodelay.py)",
    )
    parser.add_argument(
        "--narwhal-compiled",
        action="store_true",
        help=f"phase 1 also measures {COMPILED}: .venv-compiled/bin/narwhal, the mypyc build "
        "of scripts/build_compiled.sh",
    )
    parser.add_argument("--skip", nargs="+", default=[], choices=["overhead", "faults"])
    parser.add_argument(
        "--peer-policy",
        default="power_of_two",
        choices=["power_of_two", "round_robin"],
        help="load-balancing policy of vllm-router and smg (default power_of_two)",
    )
    parser.add_argument(
        "--narwhal-bin",
        type=Path,
        default=NARWHAL,
        help="the narwhal executable benchmarked (default .venv/bin/narwhal; "
        ".venv-compiled/bin/narwhal is the mypyc build of scripts/build_compiled.sh)",
    )
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the logs directory (the routers' request logs, the engines' logs) after a run",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave every process to the scheduler (default: the router on a core of its own)",
    )
    parser.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        loadgen_main()
        return
    print(cores.pin(not args.no_pin), flush=True)
    names = list(args.only or ROUTERS)
    PEER_POLICY["policy"] = args.peer_policy
    NARWHAL_BIN["path"] = args.narwhal_bin.absolute()
    check_tools(names, args.profile or args.profile_only, args.narwhal_compiled)
    cfg = Settings.make(args.quick)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-bench-"))
    stack = Stack(workdir)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    results: dict[str, Any] = {
        "stamp": stamp,
        "quick": args.quick,
        "routers": names,
        "machine": machine(),
        "settings": {
            **cfg.__dict__,
            "peer_policy": args.peer_policy,
            "narwhal_bin": str(NARWHAL_BIN["path"]),
        },
        "versions": peer_versions(),
    }
    began = time.monotonic()
    print(f"logs in {workdir}", flush=True)
    ok = False
    try:
        loadgen = LoadGen(stack)
        if not args.profile_only:
            if "overhead" not in args.skip:
                print("phase 1: overhead", flush=True)
                extra = [EXTRA] if args.narwhal_nodelay else []
                extra += [COMPILED] if args.narwhal_compiled else []
                results["overhead"] = phase_overhead(stack, loadgen, names + extra, cfg, workdir)
            if "faults" not in args.skip:
                print("phase 2: fault goodput", flush=True)
                results["faults"] = {
                    name: phase_faults(stack, loadgen, name, cfg, workdir) for name in names
                }
        if args.profile or args.profile_only:
            print("profile: py-spy on Narwhal", flush=True)
            results["profile"] = phase_profile(stack, loadgen, workdir, stamp)
        ok = True
    finally:
        stack.stop_all()
        results["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        results["wall_s"] = round(time.monotonic() - began, 1)
        if ok:
            path = RESULTS / f"routers-{stamp}.json"
            path.write_text(json.dumps(results, indent=2, default=str) + "\n")
            write_csv(RESULTS / f"routers-{stamp}.csv", results)
            print()
            print(report(results))
            print(f"\nwrote {path.relative_to(ROOT)} and .csv ({results['wall_s']:.0f} s)")
            if args.keep_logs:
                print(f"logs kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"failed; logs kept in {workdir}", file=sys.stderr)


def peer_versions() -> dict[str, str]:
    versions = {}
    for package in ("vllm-router", "smg", "py-spy"):
        pip = PEERS_BIN / "pip"
        if not pip.exists():
            break
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            shown = subprocess.run(
                [str(pip), "show", package], capture_output=True, text=True, timeout=30
            ).stdout
            for line in shown.splitlines():
                if line.startswith("Version:"):
                    versions[package] = line.split(":", 1)[1].strip()
    return versions


if __name__ == "__main__":
    main()
