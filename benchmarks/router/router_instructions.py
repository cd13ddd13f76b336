"""A router's cost in CPU instructions per request: a figure that does not move with the
machine's load. Not a test.

Wall-clock CPU time on this shared machine moves by a third from minute to minute, more than
most changes to the data path do. Instructions executed do not: this script runs a router
(``narwhal serve`` by default, or any of ``routers.py``'s) under valgrind's callgrind twice,
serving ``--base`` and then ``--base`` plus ``--requests`` streamed completions one after
another, and prints the difference per request (start-up, imports and shutdown cancel out).
Needs ``valgrind``; a few minutes per router.

    .venv/bin/python benchmarks/router/router_instructions.py            # narwhal, 1-token requests
    .venv/bin/python benchmarks/router/router_instructions.py --only narwhal vllm-router
    .venv/bin/python benchmarks/router/router_instructions.py --tokens 64 --decode-s-per-token 0.01
    .venv/bin/python benchmarks/router/router_instructions.py --narwhal-bin ../old/.venv/bin/narwhal
    .venv/bin/python benchmarks/router/router_instructions.py --only narwhal narwhal-compiled
    .venv/bin/python benchmarks/router/router_instructions.py --only narwhal-compiled --functions 25

The engines and the routers' settings are ``benchmarks/router/routers.py``'s (one producer, one
consumer, every timing 0 unless ``--decode-s-per-token``); Narwhal's first-token and silence
timeouts are raised to 30 s, since under callgrind it runs about 50 times slower. With
``--decode-s-per-token 0.01`` every chunk comes in a read of its own, as from a real engine (at
full speed several arrive together); the cost per chunk is then the 64-token figure less the
1-token one, over 63. Counts are user-space instructions only (the kernel's work for each read
and write is alike for every router), a Rust router's threads together (valgrind runs them one
at a time); they include what a router does per second of wall time (Narwhal's lag monitor's
heartbeat), so paced runs, whose length the engines set, are compared with paced runs.
``--functions N`` also prints where a request's instructions go: the N functions (C functions:
the interpreter's, the compiled build's, the libraries') with the most instructions of their
own per request, and the shares of the allocator and of the cyclic garbage collector.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_routers import (
    COMPILED,
    NARWHAL,
    NARWHAL_BIN,
    ROUTERS,
    RouterSpec,
    router_spec,
    wait_router,
)
from bench_stack import MODEL, PROMPT_FILLER, Fleet, Stack, start_fleet


def stream_completions(url: str, requests: int, tokens: int, timeout: float = 120) -> None:
    """``requests`` streamed completions of ``tokens`` tokens through the router at ``url``,
    one after another, each read to its end (``SystemExit`` on a status other than 200)."""
    import httpx

    body = {
        "model": MODEL,
        "prompt": PROMPT_FILLER * 6,
        "max_tokens": tokens,
        "stream": True,
    }
    with httpx.Client(timeout=timeout) as client:
        for _ in range(requests):
            with client.stream("POST", url + "/v1/completions", json=body) as reply:
                if reply.status_code != 200:
                    raise SystemExit(f"status {reply.status_code} from {url}")
                for _chunk in reply.iter_bytes():
                    pass


def serve_and_count(
    argv: list[str], url: str, requests: int, tokens: int, out: Path, cache_sim: bool
) -> dict[str, int]:
    """Callgrind's event totals (``Ir``, the instructions; with ``cache_sim`` also the
    simulated cache's reads and misses) of one router process (``argv``, serving at ``url``)
    while it served ``requests`` streamed completions, one after another."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no"]
    if cache_sim:
        cmd.append("--cache-sim=yes")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with open(out.with_suffix(".err"), "w") as err:
        proc = subprocess.Popen(cmd + argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_router(RouterSpec("router", url, argv, ""), 300)
        stream_completions(url, requests, tokens)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    text = out.read_text(errors="replace")
    events = re.search(r"^events: (.+)$", text, re.M)
    totals = re.search(r"^(?:summary|totals): ([\d ]+)$", text, re.M)
    if events is None or totals is None:
        raise SystemExit(f"no event totals in {out}")
    return dict(zip(events.group(1).split(), map(int, totals.group(1).split()), strict=True))


# CPython's object allocator and deallocators, and its cyclic garbage collector (tracking,
# untracking, collections, the types' traverse functions), by file and function name.
ALLOCATOR = ("obmalloc.c:", "dealloc")
COLLECTOR = ("gcmodule.c:", "traverse")


def own_instructions(callgrind_out: Path) -> dict[str, int]:
    """Instructions of each function's own code (not its callees), by callgrind_annotate."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(callgrind_out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    own: dict[str, int] = {}
    for match in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[(.*)\])?$", text, re.M):
        where = match.group(2)
        if where in ("PROGRAM TOTALS", "events annotated") or ":" not in where:
            continue  # totals and source lines, not functions
        library = Path(match.group(3)).name if match.group(3) else ""
        key = f"{where.rsplit('/', 2)[-1]}  {library}".strip()
        own[key] = own.get(key, 0) + int(match.group(1).replace(",", ""))
    return own


def print_functions(base: Path, more: Path, requests: int, top: int) -> None:
    """The per-request difference of two runs' per-function counts: the ``top`` functions, and
    the allocator's and the collector's shares of the whole."""
    before, after = own_instructions(base), own_instructions(more)
    per_request = {k: (v - before.get(k, 0)) / requests for k, v in after.items()}
    total = sum(per_request.values())
    print(f"  {total / 1e3:.1f} k instructions per request in functions; the most:")
    for key, count in sorted(per_request.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {count / 1e3:8.1f} k  {key}")
    for label, parts in (("allocator", ALLOCATOR), ("cyclic collector", COLLECTOR)):
        share = sum(v for k, v in per_request.items() if any(p in k for p in parts))
        print(f"  {label}: {share / 1e3:.1f} k per request, {share / total:.1%}")


def router_argv(name: str, fleet: Fleet, workdir: Path) -> tuple[list[str], str]:
    """How ``routers.py`` starts ``name``, with Narwhal's timeouts raised to 30 s (under
    callgrind it runs about 50 times slower)."""
    spec = router_spec(name, fleet, workdir, 60.0)
    if name in ("narwhal", COMPILED):
        config = Path(spec.argv[spec.argv.index("--config") + 1])
        text = config.read_text()
        for key in ("first_token_timeout_s", "decode_read_timeout_s"):
            text = text.replace(f"{key} = 1.0", f"{key} = 30.0")
        config.write_text(text)
    return spec.argv, spec.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = (*ROUTERS, COMPILED)
    parser.add_argument("--only", nargs="+", default=["narwhal"], choices=names)
    parser.add_argument("--narwhal-bin", type=Path, default=NARWHAL)
    parser.add_argument("--base", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--decode-s-per-token", type=float, default=0.0)
    parser.add_argument(
        "--functions",
        type=int,
        default=0,
        metavar="N",
        help="also print the N functions with the most instructions of their own per request",
    )
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="also simulate the caches: first-level instruction and data misses per request",
    )
    args = parser.parse_args()
    NARWHAL_BIN["path"] = args.narwhal_bin.absolute()
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-instructions-"))
    stack = Stack(workdir)
    per_request: dict[str, dict[str, float]] = {}
    try:
        fleet = start_fleet(stack, "cg", 1, 1, args.decode_s_per_token)
        for name in args.only:
            counts, outs = [], []
            for n in (args.base, args.base + args.requests):
                argv, url = router_argv(name, fleet, workdir)
                outs.append(workdir / f"{name}-{n}.callgrind")
                counts.append(serve_and_count(argv, url, n, args.tokens, outs[-1], args.cache_sim))
                print(f"{name}, {n} requests: {counts[-1]['Ir']:,} instructions", flush=True)
            if args.functions:
                print_functions(outs[0], outs[1], args.requests, args.functions)
            per_request[name] = {
                event: (counts[1][event] - counts[0][event]) / args.requests for event in counts[0]
            }
    finally:
        stack.stop_all()
    shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\nuser-space instructions per {args.tokens}-token request "
        f"(decode {args.decode_s_per_token:g} s per token)"
    )
    for name, count in per_request.items():
        line = f"{name:>14}: {count['Ir'] / 1e6:.3f} M"
        if args.cache_sim:  # callgrind's first-level misses: instruction, data read, data write
            line += "; first-level misses per request: " + ", ".join(
                f"{event} {count[event] / 1e3:.1f} k" for event in ("I1mr", "D1mr", "D1mw")
            )
        print(line)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("router_instructions"):
        main()
