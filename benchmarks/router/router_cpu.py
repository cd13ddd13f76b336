"""Where a router's CPU per 1-token request goes: user against system time, and (``--perf``)
which shared objects the user time is spent in. Not a test.

Usage::

    .venv/bin/python benchmarks/router/router_cpu.py         # narwhal, vllm-router, aiohttp-relay
    .venv/bin/python benchmarks/router/router_cpu.py --perf  # and perf's split of Narwhal's samples
    .venv/bin/python benchmarks/router/router_cpu.py --only narwhal narwhal-compiled vllm-router \
        --rounds 5
    .venv/bin/python benchmarks/router/router_cpu.py --only narwhal narwhal-compiled vllm-router \
        --rounds 5 --rate 120
    .venv/bin/python benchmarks/router/router_cpu.py --only narwhal-compiled vllm-router \
        --rounds 5 --narwhal-bin compiled-other=OTHER/.venv-compiled/bin/narwhal

The fleet, the routers and the load client are ``benchmarks/router/routers.py``'s (one producer, one
consumer, every timing at 0; 16 closed-loop streamed completions of one token), ``--rounds``
rounds per router (2 unless given), alternated. Each round reads the router process's user and
system CPU (every thread) from ``/proc`` when the measured window opens and ends; the summary
gives each router's median and its ratio to vllm-router round by round. ``--rate R`` sends
every router the same open-loop load instead, R requests a second for 4 s: a router's CPU per
request falls as its request rate rises (more work per wake-up), and closed-loop rounds give
each router the rate the shared engines allow it at that moment, so equal rates compare the
routers at equal work (a rate the engines cannot keep up with ends the run: Narwhal's
first-token timeouts fail requests there). ``--perf`` records the router with ``perf record -F
1999 -g`` during its second round and prints ``perf report``'s share of samples by shared
object (``libpython`` is Python bytecode being run, ``loop.cpython`` uvloop, ``[kernel.kallsyms]``
the system calls). ``--narwhal-bin NAME=PATH`` adds a Narwhal executable of another venv (an
interpreter's build, say) to the same alternated rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cores  # this folder's: which core each process runs on
from bench_routers import COMPILED, NARWHAL_NAMED, router_spec, wait_router
from bench_stack import CLK_TCK, LoadGen, Stack, start_fleet

NARWHALS = ("narwhal", COMPILED)  # --perf records each build of Narwhal


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of every thread of ``pid``."""
    user = system = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    return user / CLK_TCK, system / CLK_TCK


def perf_split(recording: Path, sort: str = "dso", rows: int = 12) -> str:
    """``perf report``'s first ``rows`` lines: the share of samples by ``sort`` (perf's keys:
    ``dso`` the shared object, ``dso,sym`` its functions too)."""
    report = subprocess.run(
        ["perf", "report", "-i", str(recording), "--no-children", "-g", "none", "--sort", sort],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line for line in report.splitlines() if line.strip() and not line.startswith("#")]
    return "\n".join(line.rstrip() for line in lines[:rows])


def measure(
    loadgen: LoadGen,
    name: str,
    url: str,
    pid: int,
    recording: Path | None,
    rate: float | None = None,
) -> tuple[int, float, float]:
    """One round: requests served, and the router's user and system CPU seconds meanwhile
    (recorded by perf into ``recording`` when one is given)."""
    marks: dict[str, Any] = {}

    def opened() -> None:
        marks["start"] = cpu_times(pid)
        if recording is not None:
            marks["perf"] = subprocess.Popen(
                ["perf", "record", "-F", "1999", "-g", "-p", str(pid), "-o", str(recording)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def closed() -> None:
        marks["end"] = cpu_times(pid)
        if "perf" in marks:
            marks["perf"].send_signal(2)
            marks["perf"].wait(30)

    target = {"kind": "router", "url": url, "name": name}
    if rate is None:
        load = {"cmd": "throughput", "concurrency": 16, "warmup": 1.0}
    else:  # open loop: requests sent at ``rate`` per second whatever the answers' pace
        load = {"cmd": "faults", "rate": rate}
    result = loadgen.run(
        {**load, "target": target, "max_tokens": 1, "bound": 30.0, "duration": 4.0},
        on_start=opened,
        on_end=closed,
    )
    (user0, sys0), (user1, sys1) = marks["start"], marks["end"]
    if rate is None:
        return sum(result["outcomes"].values()), user1 - user0, sys1 - sys0
    served = sum(record["outcome"] == "ok" for record in result["records"])
    if served < len(result["records"]):
        outcomes = Counter(record["outcome"] for record in result["records"])
        raise SystemExit(f"{name} at {rate}/s: {dict(outcomes)}")
    return served, user1 - user0, sys1 - sys0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=["narwhal", "vllm-router", "aiohttp-relay"])
    parser.add_argument("--perf", action="store_true", help="perf's split of Narwhal's samples")
    parser.add_argument("--no-pin", action="store_true", help="no core of its own for the router")
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds per router")
    parser.add_argument(
        "--rate", type=float, help="open loop: this many requests per second to every router"
    )
    parser.add_argument(
        "--narwhal-bin",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also measure the narwhal executable PATH under NAME (repeatable), e.g. the same "
        "build installed with another interpreter",
    )
    args = parser.parse_args()
    for item in args.narwhal_bin:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            parser.error(f"--narwhal-bin {item!r}: expected NAME=PATH of an existing executable")
        if name in args.only:
            parser.error(f"--narwhal-bin {item!r}: {name} is already measured")
        NARWHAL_NAMED[name] = Path(path).absolute()
        args.only.append(name)
    print(cores.pin(not args.no_pin), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-router-cpu-"))
    stack = Stack(workdir)
    try:
        fleet = start_fleet(stack, "cpu", 1, 1)
        loadgen = LoadGen(stack)
        specs = {}
        for name in args.only:
            spec = router_spec(name, fleet, workdir, 30.0)
            stack.start(name, spec.argv, router=True)
            wait_router(spec, 30)
            specs[name] = spec
        totals: dict[str, list[float]] = {name: [] for name in specs}
        for round_index in range(args.rounds):
            for name, spec in specs.items():
                narwhal = name in NARWHALS or name in NARWHAL_NAMED
                profile = args.perf and round_index == 1 and narwhal
                recording = workdir / f"{name}.perf" if profile else None
                served, user, system = measure(
                    loadgen, name, spec.url, stack.procs[name].pid, recording, args.rate
                )
                print(
                    f"{name:>14} round {round_index + 1}: {served} requests, per request "
                    f"user {1e3 * user / served:.3f} ms, system {1e3 * system / served:.3f} ms",
                    flush=True,
                )
                totals[name].append((user + system) / served)
                if recording is not None:
                    print(perf_split(recording))
                    print(perf_split(recording, "dso,sym", 25))
        print(summary(totals))
    finally:
        stack.stop_all()


def summary(totals: dict[str, list[float]]) -> str:
    """Each router's median CPU per request over its rounds, and its ratio to vllm-router's
    in each round (rounds alternate, so a round's ratio compares neighbours in time)."""
    lines = ["median user + system CPU per request, and the ratio to vllm-router round by round"]
    base = totals.get("vllm-router")
    for name, values in totals.items():
        line = f"{name:>14}: {1e3 * statistics.median(values):.3f} ms"
        if base is not None and name != "vllm-router":
            ratios = [value / reference for value, reference in zip(values, base, strict=True)]
            line += (
                f", ratio {statistics.median(ratios):.2f}x ("
                + ", ".join(f"{ratio:.2f}" for ratio in ratios)
                + ")"
            )
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("router_cpu"):
        main()
