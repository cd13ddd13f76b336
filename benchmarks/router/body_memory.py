"""Memory and event-loop stall of one large JSON body sent through the live router.

What it measures: a live router (in this process, in a thread) in front of two ``narwhal
emulate`` engines (separate processes, so their memory is not counted). For each body shape it
sends one completion request whose ``extra`` field holds about 4 MiB of tiny JSON values (or a
body just under ``admission.max_json_values``), and reports:

- the status the router answered;
- the memory the request cost the router: the peak of ``tracemalloc``'s traced memory while it
  ran, above what was traced before it was sent (the body's bytes on the client side are part
  of that baseline);
- how long the router's event loop was unavailable: the longest ``GET /health`` round trip while
  the request ran (measured in a second pass, without tracemalloc, which slows allocation down).

Run it from the repository root: ``.venv/bin/python benchmarks/router/body_memory.py``. The same
script runs against another checkout's code with ``PYTHONPATH=/path/to/checkout`` (the API it
uses is the router's defaults and ``narwhal emulate``). It is not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

from narwhal.core.config import parse_config
from narwhal.live.app import Router
from narwhal.live.serving import make_router_server
from narwhal.serving import BackgroundServer, bind, port_of

FOUR_MIB = 4 * 1024 * 1024
UNITS = {"zeros": b"0,", "empty-objects": b"{},", "empty-arrays": b"[],", "halves": b"0.5,"}


def body(unit: bytes, size: int | None = None, values: int | None = None) -> bytes:
    """A completion request with ``extra``: a list of ``unit`` filling ``size`` bytes, or of
    ``values`` units."""
    head = b'{"model":"tiny-llama","prompt":"hi","max_tokens":2,"extra":['
    count = values if values is not None else (size or FOUR_MIB) // len(unit) - 40
    return head + unit * (count - 1) + unit[:-1] + b"]}"


def free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = port_of(sock)
    sock.close()
    return port


def start_engine(role: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "narwhal.cli", "emulate", "--port", str(port), "--role", role],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"emulator on {url} did not start")


def worst_health_latency(url: str, done: threading.Event) -> float:
    worst = 0.0
    with httpx.Client(timeout=60) as client:
        while not done.is_set():
            started = time.perf_counter()
            client.get(url + "/health")
            worst = max(worst, time.perf_counter() - started)
            time.sleep(0.005)
    return worst


def send(url: str, raw: bytes) -> int:
    with httpx.Client(timeout=120) as client:
        reply = client.post(
            url + "/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
        return reply.status_code


def measure(url: str, raw: bytes) -> dict[str, Any]:
    send(url, b'{"model":"tiny-llama","prompt":"warm","max_tokens":2}')
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    status = send(url, raw)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    done = threading.Event()
    result: list[float] = []
    watcher = threading.Thread(target=lambda: result.append(worst_health_latency(url, done)))
    watcher.start()
    time.sleep(0.05)
    send(url, raw)
    done.set()
    watcher.join()
    return {
        "body_mib": round(len(raw) / 2**20, 2),
        "status": status,
        "peak_mb": round((peak - baseline) / 1e6, 1),
        "worst_health_s": round(result[0], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="*", default=list(UNITS), choices=list(UNITS))
    parser.add_argument(
        "--values", type=int, default=262_000, help="values of the 'just under' bodies"
    )
    args = parser.parse_args()
    engines = [start_engine("prefill"), start_engine("decode")]
    try:
        config = parse_config(
            {
                "engines": [
                    {"url": engines[0][1], "role": "prefill"},
                    {"url": engines[1][1], "role": "decode"},
                ]
            }
        )
        router = Router(config)
        sock = bind("127.0.0.1", 0)
        with BackgroundServer(make_router_server(router, client=config.client), [sock]):
            url = f"http://127.0.0.1:{port_of(sock)}"
            for kind in args.kinds:
                for label, raw in (
                    ("4 MiB", body(UNITS[kind])),
                    (f"{args.values} values", body(UNITS[kind], values=args.values)),
                ):
                    print(json.dumps({"shape": kind, "size": label, **measure(url, raw)}))
    finally:
        for process, _ in engines:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("body_memory"):
        main()
