"""``narwhal serve --workers 1`` against ``--workers 2``, in one run, under the same load.

Usage (from the repository root):

    .venv/bin/python benchmarks/router/workers.py [--workers 1 2] [--rounds 2] [--seconds 5]

One producer and one consumer (``narwhal emulate`` with all timing zero, TCP_NODELAY as a real
vLLM has) are shared by every router; each router setting is a ``narwhal serve --workers N``
on its own port, all started before the first round and measured in alternating rounds, so
background load hits them alike. Two closed-loop workloads through each, with the load
generator of benchmarks/router/routers.py in its own process: streamed completions of ``--tokens``
chunks at ``--concurrency`` (client-seen chunks/s), and one-token requests (requests/s). The
router's CPU is utime + stime of the supervisor and every worker (the workers run in process
groups of their own, so they are found as the supervisor's children), read when the measured
window opens and closes. The load average is printed with the results: on a machine with few
cores shared with other work, a second worker can only take what the cores have left.
Results go to benchmarks/results/workers-<stamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_phases import aggregate
from bench_routers import NARWHAL, RouterSpec, narwhal_config, wait_router
from bench_stack import CLK_TCK, RESULTS, LoadGen, Stack, free_port, start_fleet


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime in seconds) of ``pid``, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and its children (the supervisor and its workers)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _stat(pid)
        if stat is not None and (pid == root or stat[0] == root):
            total += stat[1]
    return total


def measure(
    loadgen: LoadGen,
    target: dict[str, Any],
    root: int,
    concurrency: int,
    seconds: float,
    tokens: int,
) -> dict[str, Any]:
    marks: dict[str, float] = {}
    result: dict[str, Any] = loadgen.run(
        {
            "cmd": "throughput", "target": target, "concurrency": concurrency,
            "duration": seconds, "warmup": 0.5, "max_tokens": tokens, "bound": 30.0,
        },
        on_start=lambda: marks.__setitem__("start", tree_cpu_seconds(root)),
        on_end=lambda: marks.__setitem__("end", tree_cpu_seconds(root)),
    )  # fmt: skip
    result["router_cpu_s"] = marks["end"] - marks["start"]
    result["loadgen_cpu_s"] = 0.0
    result["decode_conns_closed"] = 0
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="narwhal-workers-"))
    stack = Stack(workdir)
    started = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {"settings": vars(args), "machine": platform.platform()}
    try:
        loadgen = LoadGen(stack)
        fleet = start_fleet(stack, "wk", 1, 1)
        config = workdir / "narwhal.toml"
        config.write_text(narwhal_config(fleet, 60.0))
        specs: dict[int, RouterSpec] = {}
        for count in args.workers:
            port = free_port()
            argv = [str(NARWHAL), "serve", "--config", str(config), "--port", str(port),
                    "--workers", str(count)]  # fmt: skip
            specs[count] = RouterSpec(f"workers-{count}", f"http://127.0.0.1:{port}", argv, "")
            stack.start(specs[count].name, argv)
        for spec in specs.values():
            wait_router(spec, 60)
        rounds: dict[str, dict[int, list[dict[str, Any]]]] = {
            "streaming": {n: [] for n in specs},
            "requests": {n: [] for n in specs},
        }
        load_before = os.getloadavg()
        for index in range(args.rounds):
            for workload, tokens in (("streaming", args.tokens), ("requests", 1)):
                for count, spec in specs.items():
                    target = {"name": spec.name, "kind": "router", "url": spec.url}
                    root = stack.procs[spec.name].pid
                    got = measure(loadgen, target, root, args.concurrency, args.seconds, tokens)
                    rounds[workload][count].append(got)
                    print(
                        f"  round {index + 1} {workload} --workers {count}: "
                        f"{got['chunks'] / got['elapsed']:.0f} chunks/s, "
                        f"router CPU {got['router_cpu_s']:.2f} s",
                        flush=True,
                    )
        results["load_average"] = {"before": load_before, "after": os.getloadavg()}
        results["cores"] = os.cpu_count()
        for workload, by_count in rounds.items():
            results[workload] = {
                str(n): aggregate(runs, f"workers-{n}") for n, runs in by_count.items()
            }
    finally:
        stack.stop_all()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"workers-{started}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\ncores {results['cores']}, load average {results['load_average']}")
    print(f"{'workers':>8} {'chunks/s':>10} {'CPU ms/1000 chunks':>19} {'req/s':>8} "
          f"{'CPU ms/req':>11} {'router cores busy':>18}")  # fmt: skip
    for n in specs:
        stream, req = results["streaming"][str(n)], results["requests"][str(n)]
        print(
            f"{n:>8} {stream['chunks_per_s']:>10.0f} {stream['cpu_ms_per_1000_chunks']:>19.0f} "
            f"{req['requests_per_s']:>8.0f} {req['cpu_ms_per_request']:>11.2f} "
            f"{stream['router_cores_busy']:>18.2f}"
        )
    print(f"results in {out}")


if __name__ == "__main__":
    main()
