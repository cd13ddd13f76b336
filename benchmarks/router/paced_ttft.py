"""Time to first token under 16 concurrent streams, from engines that pace their tokens: what
a router adds to TTFT under load when the fleet is not saturated. Not a test.

Usage::

    .venv/bin/python benchmarks/router/paced_ttft.py  # narwhal, vllm-router, aiohttp-relay (~2 min)
    .venv/bin/python benchmarks/router/paced_ttft.py --only narwhal vllm-router --rounds 5

The fleet, the routers (with their settings) and the load generator are
``benchmarks/router/routers.py``'s: one producer and one consumer (``narwhal emulate``, decode
``--decode-s-per-token`` seconds per token, 0.01 by default, every other timing 0), 16
closed-loop streamed completions of 64 tokens, rounds alternating between the targets
(``direct``: decode-only on the consumer; ``direct-pd``: the load generator does the prefill
leg and the decode leg itself, no router). In ``routers.py``'s throughput rounds the
engines run at full speed, so the consumer emulator is saturated and its turn-taking between
new and running streams sets the TTFT there (a router that streams faster leaves the consumer
busier with running streams); paced, the consumer has spare time, and the TTFT a router adds
over ``direct`` is its own.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cores  # this folder's: which core each process runs on
from bench_phases import aggregate, measure
from bench_report import ms, pct, table
from bench_routers import router_spec, wait_router
from bench_stack import LoadGen, Stack, start_fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=["narwhal", "vllm-router", "aiohttp-relay"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="per round and target")
    parser.add_argument("--decode-s-per-token", type=float, default=0.01)
    parser.add_argument("--no-pin", action="store_true", help="no core of its own for the router")
    args = parser.parse_args()
    print(cores.pin(not args.no_pin), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-paced-"))
    stack = Stack(workdir)
    rounds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    try:
        fleet = start_fleet(stack, "paced", 1, 1, args.decode_s_per_token)
        loadgen = LoadGen(stack)
        prefill, decode = fleet.prefills[0].url, fleet.decodes[0].url
        targets: list[dict[str, Any]] = [
            {"name": "direct", "kind": "direct", "url": decode},
            {"name": "direct-pd", "kind": "direct_pd", "prefill": prefill, "decode": decode},
        ]
        for name in args.only:
            spec = router_spec(name, fleet, workdir, 30.0)
            # "ovh-": the name measure (bench_phases) reads CPU from
            stack.start(f"ovh-{name}", spec.argv, router=True)
            wait_router(spec, 30)
            targets.append({"name": name, "kind": "router", "url": spec.url})
        for round_index in range(args.rounds):
            for target in targets:
                result = measure(
                    stack, loadgen, target, 16, args.seconds, 64, fleet.decodes[0].port
                )
                rounds[target["name"]].append(result)
                bad = {k: v for k, v in result["outcomes"].items() if k != "ok"}
                print(
                    f"round {round_index + 1} {target['name']:>14}: TTFT p50 "
                    f"{ms(pct(result['ttfts'], 50))} ms, "
                    f"{result['chunks'] / result['elapsed']:.0f} chunks/s"
                    + (f", not ok: {bad}" if bad else ""),
                    flush=True,
                )
    finally:
        stack.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    base = aggregate(rounds["direct"], "direct")["ttft_p50_ms"]
    rows = []
    for name, measured in rounds.items():
        total = aggregate(measured, name)
        per_chunk = total["cpu_ms_per_1000_chunks"]
        ttfts = [t for r in measured for t in r["ttfts"]]
        rows.append(
            [
                name,
                len(ttfts),
                f"{total['ttft_p50_ms']:.2f}",
                ms(pct(ttfts, 90)),
                f"{total['ttft_p50_ms'] - base:.2f}",
                "-" if per_chunk is None else f"{per_chunk:.1f}",
            ]
        )
    print(
        f"\n16 closed-loop streams of 64 tokens, decode {1e3 * args.decode_s_per_token:g} ms "
        f"per token, {args.rounds} rounds of {args.seconds:g} s per target"
    )
    headers = ["target", "n", "TTFT p50 ms", "p90 ms", "added p50 ms", "CPU ms / 1000 chunks"]
    print(table(headers, rows))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("paced_ttft"):
        main()
