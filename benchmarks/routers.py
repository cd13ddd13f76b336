"""Narwhal side by side with the P/D routers users would pick instead, in one run.

Usage (from the repository root; the peers live in their own venv, see benchmarks/setup_peers.sh):

    .venv/bin/python benchmarks/routers.py [--quick] [--profile] [--narwhal-nodelay] [--only ...]

Routers: Narwhal (``narwhal serve``), vllm-router 0.1.17 (``--vllm-pd-disaggregation``),
smg 1.13.0 (``smg launch --pd-disaggregation``, workers from a file manifest naming the
NixlConnector), a naive Starlette + httpx proxy (benchmarks/naive_proxy.py) and a logic-free relay
on aiohttp and uvloop (benchmarks/aiohttp_relay.py: the floor of Narwhal's own HTTP stack). Every
engine is ``narwhal emulate`` with all timing set to zero, on 127.0.0.1, started through
benchmarks/nodelay.py (TCP_NODELAY on its connections, as a real vLLM has). docs/benchmarks.md
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

The load generator is this file run with ``--loadgen`` in its own process (aiohttp, uvloop), driven
over stdin/stdout with JSON lines. Each router runs on a core of its own, the engines and the load
generator on the others (benchmarks/cores.py; ``--no-pin`` leaves them to the scheduler).
Results go to benchmarks/results/routers-<stamp>.{json,csv}. ``--profile`` also records
Narwhal with py-spy under two loads and prints where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import gzip
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cores  # this folder's: which core each process runs on

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
PEERS_BIN = BENCH / ".venv-peers" / "bin"
PY = ROOT / ".venv" / "bin" / "python"
NARWHAL = ROOT / ".venv" / "bin" / "narwhal"
NARWHAL_BIN = {"path": NARWHAL}  # --narwhal-bin: e.g. .venv-compiled/bin/narwhal (mypyc build)
NODELAY = BENCH / "nodelay.py"  # engines with TCP_NODELAY, like a real vLLM (see nodelay.py)
MODEL = "tiny-llama"
ROUTERS = ("narwhal", "vllm-router", "smg", "naive", "aiohttp-relay")
EXTRA = "narwhal-nodelay"  # Narwhal with TCP_NODELAY on its client side (--narwhal-nodelay)
COMPILED = "narwhal-compiled"  # the mypyc build, scripts/build_compiled.sh (--narwhal-compiled)
NARWHAL_COMPILED = ROOT / ".venv-compiled" / "bin" / "narwhal"
PROMPT_FILLER = "Summarize the quarterly report of the northern fisheries cooperative. "
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ====================================================================== load generator (child)


def _expected(prompt: str, max_tokens: int) -> str:
    from narwhal.emulator.text import completion_text

    return completion_text({"prompt": prompt}, False, max_tokens)


async def _one(
    client: Any,
    target: dict[str, Any],
    prompt: str,
    max_tokens: int,
    bound: float,
    counter: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One streamed completion through ``target``; never raises."""
    import aiohttp

    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
    }
    rec: dict[str, Any] = {
        "status": None,
        "ttft": None,
        "latency": None,
        "tokens": 0,
        "done": False,
        "error_event": False,
        "outcome": "error",
        "detail": "",
    }
    text: list[str] = []
    start = time.perf_counter()
    try:
        async with asyncio.timeout(bound):
            if target["kind"] == "direct_pd":
                leg = dict(body, max_tokens=1, stream=False)
                leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
                async with client.post(target["prefill"] + "/v1/completions", json=leg) as reply:
                    prefilled = json.loads(await reply.read())
                body["kv_transfer_params"] = prefilled.get("kv_transfer_params")
                url = target["decode"] + "/v1/completions"
            else:
                url = target["url"] + "/v1/completions"
            async with client.post(url, json=body) as response:
                rec["status"] = response.status
                if response.status != 200:
                    rec["detail"] = (await response.read())[:200].decode(errors="replace")
                    rec["outcome"] = "error"
                else:
                    buf = b""
                    async for chunk in response.content.iter_any():
                        buf += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
                        while True:
                            cut = buf.find(b"\n\n")
                            if cut < 0:
                                break
                            event, buf = buf[:cut], buf[cut + 2 :]
                            for line in event.split(b"\n"):
                                if not line.startswith(b"data:"):
                                    continue
                                data = line[5:].strip()
                                if data == b"[DONE]":
                                    rec["done"] = True
                                    continue
                                obj = json.loads(data)
                                if "error" in obj:
                                    rec["error_event"] = True
                                    rec["detail"] = str(obj["error"])[:200]
                                    continue
                                choices = obj.get("choices") or []
                                token = choices[0].get("text") if choices else None
                                if token:
                                    if rec["ttft"] is None:
                                        rec["ttft"] = time.perf_counter() - start
                                    rec["tokens"] += 1
                                    text.append(token)
                                    if counter is not None:
                                        counter["chunks"] += 1
                    got = "".join(text)
                    if rec["error_event"]:
                        rec["outcome"] = "error"
                    elif got == _expected(prompt, max_tokens):
                        rec["outcome"] = "ok"
                    else:
                        rec["outcome"] = "wrong"
                        rec["detail"] = f"{len(got)}/{max_tokens} chars, done={rec['done']}"
    except TimeoutError:
        rec["outcome"] = "hung"
        rec["detail"] = f"status={rec['status']} tokens={rec['tokens']}"
    except (aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as error:
        rec["outcome"] = "error"
        rec["detail"] = f"{type(error).__name__}: {error}"[:200]
    rec["latency"] = time.perf_counter() - start
    return rec


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def _cmd_ttft(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    targets, rng = cmd["targets"], random.Random(cmd.get("seed", 0))
    out: dict[str, dict[str, Any]] = {
        t["name"]: {"ttft": [], "outcomes": Counter()} for t in targets
    }
    for index in range(cmd["warmup"] + cmd["rounds"]):
        order = list(targets)
        rng.shuffle(order)
        for target in order:
            prompt = f"{PROMPT_FILLER}[ttft {index} {target['name']}]"
            rec = await _one(client, target, prompt, cmd["max_tokens"], cmd["bound"])
            if index < cmd["warmup"]:
                continue
            out[target["name"]]["outcomes"][rec["outcome"]] += 1
            if rec["outcome"] == "ok":
                out[target["name"]]["ttft"].append(rec["ttft"])
    return {name: {"ttft": v["ttft"], "outcomes": dict(v["outcomes"])} for name, v in out.items()}


async def _cmd_throughput(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    target, counter = cmd["target"], {"chunks": 0}
    outcomes: Counter[str] = Counter()
    phase = {"measuring": False, "stop": False}
    seq = iter(range(10**9))
    ttfts: list[float] = []  # of the measured requests, under this closed-loop load

    async def worker() -> None:
        while not phase["stop"]:
            prompt = f"{PROMPT_FILLER}[tput {next(seq)}]"
            rec = await _one(client, target, prompt, cmd["max_tokens"], cmd["bound"], counter)
            if phase["measuring"]:
                outcomes[rec["outcome"]] += 1
                if rec["ttft"] is not None:
                    ttfts.append(rec["ttft"])

    tasks = [asyncio.create_task(worker()) for _ in range(cmd["concurrency"])]
    await asyncio.sleep(cmd["warmup"])
    counter["chunks"] = 0
    phase["measuring"] = True
    began = time.perf_counter()
    _emit({"event": "start"})
    await asyncio.sleep(cmd["duration"])
    phase["stop"] = True
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    return {
        "chunks": counter["chunks"],
        "elapsed": elapsed,
        "outcomes": dict(outcomes),
        "all_requests": next(seq),  # warm-up included
        "ttfts": ttfts,
    }


async def _cmd_faults(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    target, total = cmd["target"], int(cmd["rate"] * cmd["duration"])
    tasks = []
    began = time.perf_counter()
    _emit({"event": "start"})
    for index in range(total):
        delay = began + index / cmd["rate"] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        prompt = f"{PROMPT_FILLER}[fault {index}]"
        tasks.append(
            asyncio.create_task(_one(client, target, prompt, cmd["max_tokens"], cmd["bound"]))
        )
    records = await asyncio.gather(*tasks)
    return {"records": records, "elapsed": time.perf_counter() - began}


def loadgen_main() -> None:
    """The load generator process: one JSON command per stdin line, one JSON answer per line.

    Its client is aiohttp's on uvloop: an httpx client on asyncio spends more CPU per chunk
    than the routers it measures, so with 16 streams the throughput rounds' TTFT was mostly
    the load generator's own queueing."""
    import aiohttp
    import uvloop

    async def serve() -> None:
        connector = aiohttp.TCPConnector(limit=2000, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line or not line.strip():
                    return
                cmd = json.loads(line)
                if cmd["cmd"] == "quit":
                    return
                handler = {
                    "ttft": _cmd_ttft,
                    "throughput": _cmd_throughput,
                    "faults": _cmd_faults,
                }[cmd["cmd"]]
                _emit({"event": "end", "result": await handler(client, cmd)})

    uvloop.run(serve())


# ====================================================================== processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in process group ``pgid`` (threads included)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        # fields[0] is field 3 (state): pgrp is field 5, utime 14, stime 15
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


class Stack:
    """Every process this run starts, each in its own process group; all stopped on exit."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, argv: list[str], *, router: bool = False, **kwargs: Any
    ) -> subprocess.Popen[bytes]:
        """Start ``argv``; a ``router`` runs on the router's core (benchmarks/cores.py)."""
        log = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - closed by the child's end
        proc = subprocess.Popen(
            argv,
            stdout=kwargs.pop("stdout", log),
            stderr=log,
            stdin=kwargs.pop("stdin", subprocess.DEVNULL),
            start_new_session=True,
            cwd=ROOT,
            preexec_fn=cores.router_preexec() if router else None,
            **kwargs,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def stop(self, name: str, grace: float = 3.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        # anything left in the group (a launcher's children) goes too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def kill(self, name: str) -> None:
        """SIGKILL, the way a machine dies (the process is reaped, the name forgotten)."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop_all(self) -> None:
        for name in list(self.procs)[::-1]:
            self.stop(name, grace=2.0)


class LoadGen:
    """The load generator child process, driven line by line."""

    def __init__(self, stack: Stack) -> None:
        self.proc = stack.start(
            "loadgen",
            [str(PY), str(Path(__file__).resolve()), "--loadgen"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.pgid = self.proc.pid

    def run(self, cmd: dict[str, Any], on_start: Any = None, on_end: Any = None) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the load generator died; see its log")
            event = json.loads(line)
            if event["event"] == "start" and on_start is not None:
                on_start()
            elif event["event"] == "end":
                if on_end is not None:
                    on_end()
                return event["result"]


# ====================================================================== fleet and routers


@dataclass
class Engine:
    name: str
    role: str
    port: int
    kv_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Fleet:
    prefills: list[Engine] = field(default_factory=list)
    decodes: list[Engine] = field(default_factory=list)


def start_fleet(
    stack: Stack, tag: str, prefills: int, decodes: int, decode_s_per_token: float = 0.0
) -> Fleet:
    """Emulated engines with every timing at 0 but ``decode_s_per_token``."""
    fleet = Fleet()
    for role, count, bucket in (
        ("prefill", prefills, fleet.prefills),
        ("decode", decodes, fleet.decodes),
    ):
        for index in range(count):
            engine = Engine(f"{tag}-{role[0]}{index + 1}", role, free_port(), free_port())
            stack.start(
                engine.name,
                [
                    str(PY), str(NODELAY), "emulate", "--port", str(engine.port), "--role", role,
                    "--kv-side-channel", f"127.0.0.1:{engine.kv_port}",
                    "--prefill-s-per-token", "0", "--decode-s-per-token", str(decode_s_per_token),
                    "--kv-s-per-token", "0", "--overhead-s", "0",
                    "--seed", str(index), "--log-level", "warning",
                ],
            )  # fmt: skip
            bucket.append(engine)
    for engine in fleet.prefills + fleet.decodes:
        wait_http(engine.url + "/health", 30)
    return fleet


def wait_http(url: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up within {timeout:.0f} s")


@dataclass
class RouterSpec:
    name: str
    url: str
    argv: list[str]
    flags: str  # what a reader needs to reproduce the fault-handling settings


def narwhal_config(fleet: Fleet, request_timeout: float) -> str:
    lines = [
        "[engine]",
        "first_token_timeout_s = 1.0",
        "decode_read_timeout_s = 1.0",
        f"request_timeout_s = {request_timeout}",
        f"max_handoff_age_s = {min(25.0, request_timeout)}",
        "",
        "[recovery]",
        "eject_after = 2",
        "max_attempts = 2",
        "probe_interval_s = 5.0",
        "",
        "[engine_contract]",
        f'model = "{MODEL}"',
        'vllm_version = "0.32.0"',
        'kv_connector = "NixlConnector"',
    ]
    for engine in fleet.prefills:
        lines += [
            "",
            "[[engines]]",
            f'url = "{engine.url}"',
            'role = "prefill"',
            f'kv_endpoint = "127.0.0.1:{engine.kv_port}"',
        ]
    for engine in fleet.decodes:
        lines += ["", "[[engines]]", f'url = "{engine.url}"', 'role = "decode"']
    return "\n".join(lines) + "\n"


PEER_POLICY = {"policy": "power_of_two"}  # --peer-policy; power_of_two is the closest to
# Narwhal's least-reserved placement (round_robin is the naive proxy's)

PEER_RESILIENCE = [
    # the peers' documented knobs set to the closest equivalent of Narwhal's settings
    "--retry-max-retries", "2",  # = max_attempts 2 (1 would disable retries)
    "--cb-failure-threshold", "2",  # = eject_after 2
    "--cb-timeout-duration-secs", "5",  # = probe_interval_s 5
    "--health-check-interval-secs", "5",
    "--health-failure-threshold", "2",
]  # fmt: skip


def router_spec(name: str, fleet: Fleet, workdir: Path, request_timeout: float) -> RouterSpec:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    timeout = str(int(request_timeout))
    if name in ("narwhal", EXTRA, COMPILED):
        config = workdir / f"narwhal-{port}.toml"
        config.write_text(narwhal_config(fleet, request_timeout))
        argv = [str(NARWHAL_BIN["path"]), "serve", "--config", str(config), "--port", str(port)]
        if name == EXTRA:
            argv[:1] = [str(PY), str(NODELAY)]
        elif name == COMPILED:
            argv[0] = str(NARWHAL_COMPILED)
        flags = (
            "first_token_timeout_s=1, decode_read_timeout_s=1, "
            f"request_timeout_s={timeout}, max_attempts=2, eject_after=2, probe_interval_s=5"
        )
    elif name == "vllm-router":
        argv = [str(PEERS_BIN / "vllm-router"), "--vllm-pd-disaggregation"]
        for engine in fleet.prefills:
            argv += ["--prefill", engine.url]
        for engine in fleet.decodes:
            argv += ["--decode", engine.url]
        argv += [
            "--host", "127.0.0.1", "--port", str(port), "--kv-connector", "nixl",
            "--policy", PEER_POLICY["policy"],
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--request-timeout-secs", timeout, *PEER_RESILIENCE,
        ]  # fmt: skip
        flags = " ".join(
            ["--policy", PEER_POLICY["policy"], "--request-timeout-secs", timeout, *PEER_RESILIENCE]
        )
    elif name == "smg":
        manifest = workdir / f"smg-{port}.json"
        workers = [
            {"url": e.url, "worker_type": "prefill", "kv_connector": "NixlConnector"}
            for e in fleet.prefills
        ] + [
            {"url": e.url, "worker_type": "decode", "kv_connector": "NixlConnector"}
            for e in fleet.decodes
        ]
        manifest.write_text(json.dumps({"version": 1, "workers": workers}))
        argv = [
            str(PEERS_BIN / "smg"), "launch", "--pd-disaggregation",
            "--discovery-provider", "file", "--discovery-file", str(manifest),
            "--host", "127.0.0.1", "--port", str(port),
            "--policy", PEER_POLICY["policy"], "--power-of-two-load-metric", "requests",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--shutdown-grace-period-secs", "1",
            "--request-timeout-secs", timeout, *PEER_RESILIENCE,
        ]  # fmt: skip
        flags = " ".join(
            [
                f"--policy {PEER_POLICY['policy']} --power-of-two-load-metric requests",
                "--request-timeout-secs",
                timeout,
                *PEER_RESILIENCE,
                "(workers from a --discovery-file manifest with kv_connector NixlConnector)",
            ]
        )
    elif name == "naive":
        argv = [str(PY), str(BENCH / "naive_proxy.py"), "--port", str(port)]
        for engine in fleet.prefills:
            argv += ["--prefill", engine.url]
        for engine in fleet.decodes:
            argv += ["--decode", engine.url]
        flags = "round robin, no retries, no breaker, no timeout but connect (5 s)"
    elif name == "aiohttp-relay":  # the floor of a Python relay on Narwhal's HTTP stack
        argv = [str(PY), str(BENCH / "aiohttp_relay.py"), "--port", str(port)]
        for engine in fleet.prefills:
            argv += ["--prefill", engine.url]
        for engine in fleet.decodes:
            argv += ["--decode", engine.url]
        flags = "logic-free relay on aiohttp + uvloop: round robin, no timeouts, no checks"
    else:
        raise ValueError(name)
    return RouterSpec(name, url, argv, flags)


def wait_router(spec: RouterSpec, timeout: float) -> None:
    """Ready = a real completion through it comes back with the expected text."""
    import httpx

    body = {"model": MODEL, "prompt": PROMPT_FILLER + "[ready]", "max_tokens": 4}
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            reply = httpx.post(spec.url + "/v1/completions", json=body, timeout=5)
            if reply.status_code == 200:
                text = reply.json()["choices"][0]["text"]
                if text == _expected(body["prompt"], 4):
                    return
                last = f"text {text!r}"
            else:
                last = f"status {reply.status_code}: {reply.text[:120]}"
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as error:
            last = f"{type(error).__name__}"
        time.sleep(0.3)
    raise RuntimeError(f"{spec.name} at {spec.url} not ready in {timeout:.0f} s (last: {last})")


# ====================================================================== statistics and output


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


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
        "kernel": platform.release(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


# ====================================================================== phases


@dataclass
class Settings:
    ttft_rounds: int
    ttft_warmup: int
    tput_rounds: int
    tput_seconds: float
    tput_concurrency: int
    tput_tokens: int
    req_seconds: float
    fault_rate: float
    fault_seconds: float
    fault_bound: float
    request_timeout: float
    kill_at: float

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(100, 10, 1, 3.0, 16, 64, 2.0, 10.0, 6.0, 15.0, 10.0, 2.0)
        return cls(400, 20, 3, 5.0, 16, 64, 4.0, 20.0, 15.0, 60.0, 30.0, 2.0)


def phase_overhead(
    stack: Stack, loadgen: LoadGen, names: list[str], cfg: Settings, workdir: Path
) -> dict[str, Any]:
    fleet = start_fleet(stack, "ovh", 1, 1)
    specs = [router_spec(name, fleet, workdir, cfg.request_timeout) for name in names]
    for spec in specs:
        stack.start(f"ovh-{spec.name}", spec.argv, router=True)
    for spec in specs:
        wait_router(spec, 60)
    prefill, decode = fleet.prefills[0].url, fleet.decodes[0].url
    fleet_port = fleet.decodes[0].port
    targets = [
        {"name": "direct", "kind": "direct", "url": decode},
        {"name": "direct-pd", "kind": "direct_pd", "prefill": prefill, "decode": decode},
    ] + [{"name": s.name, "kind": "router", "url": s.url} for s in specs]
    print(f"  TTFT: {cfg.ttft_rounds} interleaved rounds over {len(targets)} targets", flush=True)
    ttft = loadgen.run(
        {
            "cmd": "ttft",
            "targets": targets,
            "rounds": cfg.ttft_rounds,
            "warmup": cfg.ttft_warmup,
            "max_tokens": 16,
            "bound": 10.0,
        }
    )
    # two closed-loop workloads: long streams (per-chunk cost) and one-token requests
    # (per-request cost); rounds alternate between the targets
    workloads = (("streaming", cfg.tput_tokens, cfg.tput_seconds), ("requests", 1, cfg.req_seconds))
    tput: dict[str, dict[str, list[dict[str, Any]]]] = {w[0]: defaultdict(list) for w in workloads}
    for round_index in range(cfg.tput_rounds):
        for workload, tokens, seconds in workloads:
            for target in targets:
                if workload == "requests" and target["kind"] != "router":
                    continue
                result = measure(
                    stack, loadgen, target, cfg.tput_concurrency, seconds, tokens, fleet_port
                )
                tput[workload][target["name"]].append(result)
                print(
                    f"  {workload} round {round_index + 1} {target['name']}: "
                    f"{result['chunks'] / result['elapsed']:.0f} chunks/s, "
                    f"router CPU {result['router_cpu_s']:.2f} s",
                    flush=True,
                )
    for spec in specs:
        stack.stop(f"ovh-{spec.name}")
    for engine in fleet.prefills + fleet.decodes:
        stack.stop(engine.name)

    out: dict[str, Any] = {"ttft": {}}
    base = ttft["direct"]["ttft"]
    base_pd = ttft["direct-pd"]["ttft"]
    for name, data in ttft.items():
        values = data["ttft"]
        out["ttft"][name] = {
            "n": len(values),
            "outcomes": data["outcomes"],
            "p50_s": pct(values, 50),
            "p99_s": pct(values, 99),
            "mean_s": statistics.fmean(values) if values else None,
            "added_p50_s": _sub(pct(values, 50), pct(base, 50)),
            "added_p99_s": _sub(pct(values, 99), pct(base, 99)),
            "added_vs_pd_p50_s": _sub(pct(values, 50), pct(base_pd, 50)),
            "added_vs_pd_p99_s": _sub(pct(values, 99), pct(base_pd, 99)),
        }
    for workload, by_name in tput.items():
        out[workload] = {name: aggregate(rounds, name) for name, rounds in by_name.items()}
    out["flags"] = {s.name: " ".join(s.argv[1:]) for s in specs}
    out["names"] = names
    return out


def measure(
    stack: Stack,
    loadgen: LoadGen,
    target: dict[str, Any],
    concurrency: int,
    seconds: float,
    tokens: int,
    decode_port: int,
) -> dict[str, Any]:
    """One closed-loop run; the router's CPU time is read when the measured window opens/ends,
    and the connections to the consumer that were closed meanwhile are counted."""
    pgid = stack.procs[f"ovh-{target['name']}"].pid if target["kind"] == "router" else None
    marks: dict[str, float] = {}

    def sample(key: str) -> None:
        marks[key] = group_cpu_seconds(pgid) if pgid else 0.0
        marks[key + "_lg"] = group_cpu_seconds(loadgen.pgid)

    before = time_wait(decode_port)
    result: dict[str, Any] = loadgen.run(
        {
            "cmd": "throughput",
            "target": target,
            "concurrency": concurrency,
            "duration": seconds,
            "warmup": 0.5,
            "max_tokens": tokens,
            "bound": 30.0,
        },
        on_start=lambda: sample("start"),
        on_end=lambda: sample("end"),
    )
    result["decode_conns_closed"] = len(time_wait(decode_port) - before)
    result["router_cpu_s"] = marks["end"] - marks["start"]
    result["loadgen_cpu_s"] = marks["end_lg"] - marks["start_lg"]
    return result


def aggregate(rounds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    chunks = sum(r["chunks"] for r in rounds)
    elapsed = sum(r["elapsed"] for r in rounds)
    cpu = sum(r["router_cpu_s"] for r in rounds) if name != "direct" else 0.0
    outcomes: Counter[str] = Counter()
    for r in rounds:
        outcomes.update(r["outcomes"])
    ok = outcomes["ok"]
    ttfts = sorted(t for r in rounds for t in r.get("ttfts", []))
    return {
        "ttft_p50_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
        "chunks": chunks,
        "requests_ok": ok,
        "elapsed_s": elapsed,
        "chunks_per_s": chunks / elapsed if elapsed else None,
        "requests_per_s": ok / elapsed if elapsed else None,
        "router_cpu_s": cpu or None,
        "router_cores_busy": cpu / elapsed if cpu and elapsed else None,
        "chunks_per_cpu_s": chunks / cpu if cpu else None,
        "cpu_ms_per_1000_chunks": 1e6 * cpu / chunks if cpu and chunks else None,
        "cpu_ms_per_request": 1e3 * cpu / ok if cpu and ok else None,
        "loadgen_cpu_s": sum(r["loadgen_cpu_s"] for r in rounds),
        "decode_conns_closed_per_100_requests": 100.0
        * sum(r["decode_conns_closed"] for r in rounds)
        / max(1, sum(r["all_requests"] for r in rounds)),
        "outcomes": dict(outcomes),
        "rounds_chunks_per_cpu_s": [
            round(r["chunks"] / r["router_cpu_s"]) if r["router_cpu_s"] else None for r in rounds
        ],
    }


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


FAULTS = [
    ("hang_first_token", {"kind": "hang_first_token", "phase": "decode"}),
    ("stall_after_3", {"kind": "stall", "after_tokens": 3, "phase": "decode"}),
    ("early_done", {"kind": "early_done", "phase": "decode"}),
]


def phase_faults(
    stack: Stack, loadgen: LoadGen, name: str, cfg: Settings, workdir: Path
) -> dict[str, Any]:
    import httpx

    fleet = start_fleet(stack, f"flt-{name}", 2, 5)
    spec = router_spec(name, fleet, workdir, cfg.request_timeout)
    proc_name = f"flt-{name}-router"
    stack.start(proc_name, spec.argv, router=True)
    try:
        wait_router(spec, 60)
        for index in range(10):  # warm every pool a little
            body = {"model": MODEL, "prompt": f"{PROMPT_FILLER}[warm {index}]", "max_tokens": 4}
            httpx.post(spec.url + "/v1/completions", json=body, timeout=10)
        for engine, (_, fault) in zip(fleet.decodes, FAULTS, strict=False):
            reply = httpx.post(engine.url + "/admin/faults", json={"faults": [fault]}, timeout=5)
            reply.raise_for_status()
        victim = fleet.prefills[-1]
        timer = threading.Timer(cfg.kill_at, stack.kill, args=(victim.name,))
        total = int(cfg.fault_rate * cfg.fault_seconds)
        print(
            f"  {name}: {total} requests at {cfg.fault_rate:.0f}/s, bound {cfg.fault_bound:.0f} s",
            flush=True,
        )
        result = loadgen.run(
            {
                "cmd": "faults",
                "target": {"name": name, "kind": "router", "url": spec.url},
                "rate": cfg.fault_rate,
                "duration": cfg.fault_seconds,
                "bound": cfg.fault_bound,
                "max_tokens": 16,
            },
            on_start=timer.start,
        )
        timer.cancel()
        engines: dict[str, Any] = {}
        for engine, label in zip(
            fleet.decodes, [f[0] for f in FAULTS] + ["healthy"] * 5, strict=False
        ):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                state = httpx.get(engine.url + "/admin/state", timeout=5).json()
                engines[f"{engine.name} ({label})"] = {
                    k: state[k] for k in ("requests", "completed", "aborted", "running")
                }
        status = None
        if name == "narwhal":
            with contextlib.suppress(httpx.HTTPError, ValueError):
                status = httpx.get(spec.url + "/status", timeout=5).json()
    finally:
        stack.stop(proc_name)
        for engine in fleet.prefills + fleet.decodes:
            stack.stop(engine.name)
    records = result["records"]
    outcomes = Counter(r["outcome"] for r in records)
    latencies = [r["latency"] for r in records]
    ok_latencies = [r["latency"] for r in records if r["outcome"] == "ok"]
    details = Counter(
        f"{r['outcome']}: {r['status']} {r['detail'][:90]}" for r in records if r["outcome"] != "ok"
    )
    return {
        "requests": len(records),
        "outcomes": dict(outcomes),
        "success_pct": 100.0 * outcomes["ok"] / len(records) if records else None,
        "hung": outcomes["hung"],
        "wrong_200": outcomes["wrong"],
        "errors": outcomes["error"],
        "p50_latency_s": pct(latencies, 50),
        "p99_latency_s": pct(latencies, 99),
        "p99_ok_latency_s": pct(ok_latencies, 99),
        "max_latency_s": max(latencies) if latencies else None,
        "elapsed_s": result["elapsed"],
        "failure_kinds": dict(details.most_common(12)),
        "decode_engines": engines,
        "narwhal_status": status,
        "flags": spec.flags,
    }


# ====================================================================== profiling


def phase_profile(stack: Stack, loadgen: LoadGen, workdir: Path, stamp: str) -> dict[str, Any]:
    pyspy = PEERS_BIN / "py-spy"
    if not pyspy.exists():
        raise RuntimeError(f"{pyspy} missing: run benchmarks/setup_peers.sh")
    fleet = start_fleet(stack, "prof", 1, 1)
    spec = router_spec("narwhal", fleet, workdir, 30.0)
    stack.start("prof-narwhal", spec.argv, router=True)
    out: dict[str, Any] = {}
    try:
        wait_router(spec, 60)
        pid = stack.procs["prof-narwhal"].pid
        for label, tokens in (("requests", 1), ("streaming", 256)):
            raw = workdir / f"narwhal-profile-{label}-{stamp}.txt"
            seconds = 8
            cmd = {
                "cmd": "throughput",
                "target": {"name": "narwhal", "kind": "router", "url": spec.url},
                "concurrency": 16,
                "duration": seconds + 1,
                "warmup": 0.5,
                "max_tokens": tokens,
                "bound": 30.0,
            }
            spy: list[subprocess.Popen[bytes]] = []

            def record(
                raw: Path = raw, spy: list[subprocess.Popen[bytes]] = spy, seconds: int = seconds
            ) -> None:
                argv = [
                    str(pyspy), "record", "--pid", str(pid), "--rate", "200",
                    "--duration", str(seconds), "--format", "raw", "--nonblocking",
                    "--output", str(raw),
                ]  # fmt: skip
                spy.append(stack.start(f"py-spy-{raw.stem}", argv))

            closed_before = time_wait(fleet.decodes[0].port)
            result = loadgen.run(cmd, on_start=record)
            closed = len(time_wait(fleet.decodes[0].port) - closed_before)
            spy[0].wait(seconds + 30)
            stack.procs.pop(f"py-spy-{raw.stem}", None)
            out[label] = summarize_profile(raw)
            out[label]["max_tokens"] = tokens
            out[label]["chunks_per_s"] = result["chunks"] / result["elapsed"]
            out[label]["requests_per_s"] = result["outcomes"].get("ok", 0) / result["elapsed"]
            out[label]["decode_conns_closed_per_100_requests"] = (
                100.0 * closed / result["all_requests"]
            )
            kept = RESULTS / (raw.name + ".gz")
            with raw.open("rb") as src, gzip.open(kept, "wb") as dst:
                shutil.copyfileobj(src, dst)
            out[label]["raw"] = str(kept.relative_to(ROOT))  # py-spy collapsed stacks
    finally:
        stack.stop("prof-narwhal")
        for engine in fleet.prefills + fleet.decodes:
            stack.stop(engine.name)
    return out


def time_wait(port: int) -> set[tuple[str, str]]:
    """TCP connections to or from ``port`` in TIME-WAIT (each one a closed connection; they
    last 60 s). Compare two snapshots by set difference to count the closes in between."""
    text = ""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as handle:
            text += handle.read()
    hexport = f":{port:04X}"
    found = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3] == "06" and hexport in (parts[1][-5:], parts[2][-5:]):
            found.add((parts[1], parts[2]))
    return found


def _frame_parts(frame: str) -> tuple[str, str]:
    """'func (path/to/file.py:123)' -> ('func', 'path/to/file.py')."""
    func, _, rest = frame.partition(" (")
    path = rest.rstrip(")").rsplit(":", 1)[0]
    return func, path


def _bucket(path: str) -> str:
    for marker, name in (
        ("narwhal/core/", "narwhal.core"),
        ("narwhal/live/", "narwhal.live"),
        ("narwhal/engines/", "narwhal.engines"),
    ):
        if marker in path:
            return name
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in path:
        tail = path.split("/lib/python3", 1)[1].split("/", 2)
        return "stdlib:" + (tail[1].split("/")[0].removesuffix(".py") if len(tail) > 1 else "?")
    return path or "?"


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def summarize_profile(raw: Path) -> dict[str, Any]:
    """Self and inclusive samples per function and self samples per package, from py-spy raw."""
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    pkg: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack_text.split(";") if f]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        if not frames:
            continue
        total += count
        func, path = _frame_parts(frames[-1])
        self_fn[f"{_short(path)}:{func}"] += count
        pkg[_bucket(path)] += count
        seen = set()
        for frame in frames:
            f, p = _frame_parts(frame)
            key = f"{_short(p)}:{f}"
            if key not in seen:
                seen.add(key)
                incl_fn[key] += count

    def share(counter: Counter[str], top: int) -> list[list[Any]]:
        return [[k, round(100.0 * v / total, 1)] for k, v in counter.most_common(top)]

    narwhal_incl = Counter({k: v for k, v in incl_fn.items() if k.startswith("narwhal/")})
    return {
        "samples": total,
        "self_by_package_pct": share(pkg, 15),
        "self_by_function_pct": share(self_fn, 25),
        "inclusive_narwhal_functions_pct": share(narwhal_incl, 25),
    }


# ====================================================================== report


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(results: dict[str, Any]) -> str:
    out: list[str] = []
    ovh = results.get("overhead")
    names = results["routers"]
    if ovh:
        rows = []
        for name in ["direct", "direct-pd", *ovh["names"]]:
            t = ovh["ttft"][name]
            rows.append(
                [
                    name,
                    t["n"],
                    ms(t["p50_s"]),
                    ms(t["p99_s"]),
                    ms(t["added_p50_s"]),
                    ms(t["added_p99_s"]),
                ]
            )
        out.append(
            "Time to first token, ms (concurrency 1, 16 tokens, targets interleaved; "
            "direct = decode-only on the engine, direct-pd = the client does the P/D legs)"
        )
        out.append(
            table(["target", "n", "p50", "p99", "added p50 vs direct", "added p99 vs direct"], rows)
        )
        rows = []
        for name in ["direct", "direct-pd", *ovh["names"]]:
            t = ovh["streaming"][name]
            q = ovh["requests"].get(name, {})
            rows.append(
                [
                    name,
                    _num(t["chunks_per_s"], ".0f"),
                    _num(t["router_cores_busy"], ".2f"),
                    _num(t["chunks_per_cpu_s"], ".0f"),
                    _num(t["cpu_ms_per_1000_chunks"], ".1f"),
                    _num(t.get("ttft_p50_ms"), ".1f"),
                    _num(q.get("requests_per_s"), ".0f"),
                    _num(q.get("cpu_ms_per_request"), ".2f"),
                    _num(q.get("decode_conns_closed_per_100_requests"), ".0f"),
                    t["outcomes"].get("ok", 0) + q.get("outcomes", {}).get("ok", 0),
                    sum(v for k, v in t["outcomes"].items() if k != "ok")
                    + sum(v for k, v in q.get("outcomes", {}).items() if k != "ok"),
                ]
            )
        settings = results["settings"]
        out.append("")
        out.append(
            f"Throughput ({settings['tput_concurrency']} closed-loop streams; streaming = "
            f"{settings['tput_tokens']} tokens/request, requests = 1 token/request; CPU = the "
            "router's process group)"
        )
        out.append(
            table(
                ["target", "chunks/s", "router cores busy", "chunks/s per router core",
                 "router CPU ms / 1000 chunks", "streaming TTFT p50 ms", "1-token req/s",
                 "router CPU ms / request",
                 "decode conns closed / 100 req", "ok", "not ok"],
                rows,
            )
        )  # fmt: skip
    flt = results.get("faults")
    if flt:
        rows = []
        for name in names:
            f = flt[name]
            rows.append(
                [
                    name,
                    f["requests"],
                    f"{f['success_pct']:.1f}",
                    f["errors"],
                    f["wrong_200"],
                    f["hung"],
                    f"{f['p50_latency_s']:.3f}",
                    f"{f['p99_latency_s']:.2f}",
                    _num(f["p99_ok_latency_s"], ".3f"),
                ]
            )
        out.append("")
        out.append(
            f"Fault goodput (hung = not finished after {results['settings']['fault_bound']:.0f} s; "
            "latency over all requests, a hung one counted at the bound)"
        )
        out.append(
            table(
                ["router", "requests", "success %", "errors", "wrong-but-200", "hung",
                 "p50 latency s", "p99 latency s", "p99 ok latency s"],
                rows,
            )
        )  # fmt: skip
    narwhals = ["narwhal"] + ([COMPILED] if ovh and COMPILED in ovh["ttft"] else [])
    if "narwhal" in names and len(names) > 1:
        rows = []
        for peer, narwhal in [(n, w) for w in narwhals for n in names if n != "narwhal"]:
            row = [f"{narwhal} / {peer}"]
            if ovh:
                nt, pt = ovh["ttft"][narwhal], ovh["ttft"][peer]
                ns, ps = ovh["streaming"][narwhal], ovh["streaming"][peer]
                nr, pr = ovh["requests"][narwhal], ovh["requests"][peer]
                row += [
                    ratio(nt["added_p50_s"], pt["added_p50_s"]),
                    ratio(nt["added_p99_s"], pt["added_p99_s"]),
                    ratio(ns["chunks_per_cpu_s"], ps["chunks_per_cpu_s"]),
                    ratio(ns["cpu_ms_per_1000_chunks"], ps["cpu_ms_per_1000_chunks"]),
                    ratio(nr["cpu_ms_per_request"], pr["cpu_ms_per_request"]),
                ]
            else:
                row += ["-"] * 5
            if flt and narwhal == "narwhal":
                nf, pf = flt["narwhal"], flt[peer]
                row += [
                    ratio(nf["success_pct"], pf["success_pct"]),
                    f"{nf['wrong_200']} vs {pf['wrong_200']}",
                    f"{nf['hung']} vs {pf['hung']}",
                    ratio(nf["p99_latency_s"], pf["p99_latency_s"]),
                ]
            else:
                row += ["-"] * 4
            rows.append(row)
        out.append("")
        out.append(
            "Ratios Narwhal / peer, same run (better: lower, except chunks/s/core and success)"
        )
        out.append(
            table(
                ["pair", "added TTFT p50", "added TTFT p99", "chunks/s/core",
                 "CPU / 1000 chunks", "CPU / request", "success %", "wrong-200", "hung",
                 "fault p99 latency"],
                rows,
            )
        )  # fmt: skip
    prof = results.get("profile")
    if prof:
        for label, data in prof.items():
            out.append("")
            out.append(
                f"Narwhal under py-spy, {label} load ({data['max_tokens']} tokens/request, "
                f"{data['chunks_per_s']:.0f} chunks/s, {data['requests_per_s']:.0f} req/s, "
                f"{data['samples']} samples; decode connections closed per 100 requests: "
                f"{_num(data.get('decode_conns_closed_per_100_requests'), '.0f')})"
            )
            out.append(table(["package (self time)", "%"], data["self_by_package_pct"][:10]))
            out.append(table(["function (self time)", "%"], data["self_by_function_pct"][:15]))
            out.append(
                table(
                    ["narwhal function (inclusive)", "%"],
                    data["inclusive_narwhal_functions_pct"][:14],
                )
            )
    return "\n".join(out)


def write_csv(path: Path, results: dict[str, Any]) -> None:
    rows: list[list[Any]] = []
    ovh = results.get("overhead") or {}
    for name, data in ovh.get("ttft", {}).items():
        for key, value in data.items():
            if key != "outcomes":
                rows.append(["ttft", name, key, value])
    for workload in ("streaming", "requests"):
        for name, data in ovh.get(workload, {}).items():
            for key, value in data.items():
                if key not in ("outcomes", "rounds_chunks_per_cpu_s"):
                    rows.append([workload, name, key, value])
    for name, data in (results.get("faults") or {}).items():
        for key in (
            "requests",
            "success_pct",
            "errors",
            "wrong_200",
            "hung",
            "p50_latency_s",
            "p99_latency_s",
            "p99_ok_latency_s",
            "max_latency_s",
        ):
            rows.append(["faults", name, key, data[key]])  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["phase", "target", "metric", "value"])
        writer.writerows(rows)


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
            "missing: " + ", ".join(missing) + "\nrun: bash benchmarks/setup_peers.sh "
            "(installs vllm-router, smg and py-spy into benchmarks/.venv-peers)"
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
