"""The live router's cost in CPU instructions per request: a figure that does not move with the
machine's load. Not a test.

Wall-clock CPU time on this shared machine moves by a third from minute to minute, more than
most changes to the data path do. Instructions executed do not: this script runs
``narwhal serve`` under valgrind's callgrind twice, serving ``--base`` and then ``--base`` plus
``--requests`` streamed completions one after another, and prints the difference per request
(start-up, imports and shutdown cancel out). Needs ``valgrind``; a few minutes.

    .venv/bin/python benchmarks/router_instructions.py                  # 1-token requests
    .venv/bin/python benchmarks/router_instructions.py --tokens 64 --decode-s-per-token 0.01
    .venv/bin/python benchmarks/router_instructions.py --narwhal-bin ../old/.venv/bin/narwhal

The engines are ``benchmarks/routers.py``'s (one producer, one consumer, every timing 0 unless
``--decode-s-per-token``); the router's timeouts are raised to 30 s, since under callgrind it
runs about 50 times slower. With ``--decode-s-per-token 0.01`` every chunk comes in a read of
its own, as from a real engine (at full speed several arrive together); the cost per chunk is
then the 64-token figure less the 1-token one, over 63. Counts are user-space instructions
only (the kernel's work for each read and write is the same for every router), and include
what the router does per second of wall time (its lag monitor's heartbeat), which is why
paced runs, whose length the engines set, are compared with paced runs.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routers  # this folder's benchmark harness


def serve_and_count(
    narwhal: Path, config: Path, requests: int, tokens: int, workdir: Path
) -> tuple[int, float]:
    """Instructions of one ``narwhal serve`` under callgrind that served ``requests``, and the
    seconds the requests took."""
    import httpx

    port = routers.free_port()
    out = workdir / f"callgrind-{requests}.out"
    argv = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
        str(narwhal), "serve", "--config", str(config), "--port", str(port),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with open(workdir / f"callgrind-{requests}.err", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=120) as client:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if client.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"narwhal serve not ready; see {workdir}")
                time.sleep(0.5)
            body = {
                "model": routers.MODEL,
                "prompt": routers.PROMPT_FILLER * 6,
                "max_tokens": tokens,
                "stream": True,
            }
            began = time.monotonic()
            for _ in range(requests):
                with client.stream("POST", url + "/v1/completions", json=body) as reply:
                    if reply.status_code != 200:
                        raise SystemExit(f"status {reply.status_code}; see {workdir}")
                    for _chunk in reply.iter_bytes():
                        pass
            took = time.monotonic() - began
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(errors="replace"), re.M)
    if found is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(found.group(1)), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--narwhal-bin", type=Path, default=routers.NARWHAL)
    parser.add_argument("--base", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--decode-s-per-token", type=float, default=0.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="narwhal-instructions-"))
    stack = routers.Stack(workdir)
    try:
        fleet = routers.start_fleet(stack, "cg", 1, 1, args.decode_s_per_token)
        config = workdir / "narwhal.toml"
        text = routers.narwhal_config(fleet, 60.0)
        for name in ("first_token_timeout_s", "decode_read_timeout_s"):
            text = text.replace(f"{name} = 1.0", f"{name} = 30.0")
        config.write_text(text)
        counts = {}
        for n in (args.base, args.base + args.requests):
            counts[n], took = serve_and_count(args.narwhal_bin, config, n, args.tokens, workdir)
            print(f"{n} requests: {counts[n]:,} instructions ({took:.1f} s serving)", flush=True)
    finally:
        stack.stop_all()
    shutil.rmtree(workdir, ignore_errors=True)
    per_request = (counts[args.base + args.requests] - counts[args.base]) / args.requests
    print(
        f"{args.narwhal_bin}: {per_request / 1e6:.3f} M instructions per {args.tokens}-token "
        f"request (decode {args.decode_s_per_token:g} s per token)"
    )


if __name__ == "__main__":
    main()
