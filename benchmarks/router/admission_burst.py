"""A burst of simultaneous requests against the live router, with and without room for all.

What it measures: ``narwhal serve`` (its own process) in front of two ``narwhal emulate``
engines with every timing at 0. For each case, ``N`` streamed 2-token completions are sent at
once (one asyncio client, one connection each) while another thread polls ``GET /health`` on a
connection of its own.
It reports the statuses, the router's CPU time over the burst (utime + stime from
``/proc/<pid>/stat``) per request, and the longest ``/health`` round trip during the burst: how
long the router's event loop, busy starting requests, left everything else waiting (the
first-token and silence timers of the requests in flight wait the same way).

Run it from the repository root: ``.venv/bin/python benchmarks/router/admission_burst.py`` (about a
minute on 2 cores; ``--cases N:BOUND ...`` to choose). It is not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from narwhal.serving import bind, port_of

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = port_of(sock)
    sock.close()
    return port


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def start(args: list[str], url: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "narwhal.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{args[0]} on {url} did not start")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group; SIGKILL if it is still there after 30 s (a router still
    finishing a backlog of requests can take that long)."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


async def send_all(url: str, count: int) -> Counter[int]:
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 2, "stream": True}
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def one() -> int:
            async with client.stream("POST", url + "/v1/completions", json=body) as reply:
                await reply.aread()
                return reply.status_code

        return Counter(await asyncio.gather(*(one() for _ in range(count))))


def burst(url: str, count: int) -> tuple[Counter[int], float]:
    """Send ``count`` requests at once; meanwhile poll ``/health`` from another thread (its own
    connection, opened before the burst), whose longest round trip is returned."""
    worst = 0.0
    done = threading.Event()

    def poll() -> None:
        nonlocal worst
        with httpx.Client(timeout=300) as health:
            health.get(url + "/health")
            ready.set()
            while not done.is_set():
                started = time.perf_counter()
                health.get(url + "/health")
                worst = max(worst, time.perf_counter() - started)
                time.sleep(0.01)

    ready = threading.Event()
    poller = threading.Thread(target=poll)
    poller.start()
    ready.wait(10)
    try:
        statuses = asyncio.run(send_all(url, count))
    finally:
        done.set()
        poller.join()
    return statuses, worst


def run_case(engines: list[str], count: int, bound: int) -> dict[str, object]:
    config = "\n".join(
        [
            "[admission]",
            f"max_requests_in_flight = {bound}",
            "[[engines]]",
            f'url = "{engines[0]}"',
            'role = "prefill"',
            "[[engines]]",
            f'url = "{engines[1]}"',
            'role = "decode"',
        ]
    )
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as handle:
        handle.write(config)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = start(["serve", "--config", handle.name, "--port", str(port)], url)
    try:
        burst(url, 8)  # warm: code paths
        before = cpu_s(router.pid)
        statuses, worst = burst(url, count)
        used = cpu_s(router.pid) - before
    finally:
        stop(router)
        os.unlink(handle.name)
    return {
        "requests": count,
        "max_requests_in_flight": bound,
        "statuses": dict(sorted(statuses.items())),
        "router_cpu_ms_per_request": round(1000 * used / count, 2),
        "worst_health_s": round(worst, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        nargs="*",
        default=["512:512", "2048:512", "2048:4096"],  # 4096: no bound reached
        help="N:BOUND: N simultaneous requests with admission.max_requests_in_flight = BOUND",
    )
    args = parser.parse_args()
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    engines = [
        start(["emulate", "--port", str(ports[0]), "--role", "prefill"], urls[0]),
        start(["emulate", "--port", str(ports[1]), "--role", "decode"], urls[1]),
    ]
    try:
        for case in args.cases:
            count, bound = (int(part) for part in case.split(":"))
            print(json.dumps(run_case(urls, count, bound)), flush=True)
    finally:
        for engine in engines:
            stop(engine)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("admission_burst"):
        main()
