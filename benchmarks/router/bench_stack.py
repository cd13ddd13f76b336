"""The processes of a router benchmark, and the emulated engines they measure against.

Every process a run starts (engines, routers, the load generator, py-spy) goes through ``Stack``:
each in a process group of its own, a router on the router's core (cores.py, beside this
file), all stopped when the run ends. ``start_fleet`` starts the ``narwhal emulate`` producers
and consumers (every timing zero but the decode pace, TCP_NODELAY through nodelay.py);
``LoadGen`` drives the load generator child (bench_loadgen.py) over its stdin and stdout. CPU time
and closed connections are read from /proc (``group_cpu_seconds``, ``time_wait``). The paths and
the workload's constants every other module of the benchmark uses are here too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cores  # this folder's: which core each process runs on

BENCH = Path(__file__).resolve().parent  # benchmarks/router
ROOT = BENCH.parents[1]
RESULTS = ROOT / "benchmarks" / "results"  # git-ignored
PEERS_BIN = BENCH / ".venv-peers" / "bin"
PY = ROOT / ".venv" / "bin" / "python"
NODELAY = BENCH / "nodelay.py"  # engines with TCP_NODELAY, like a real vLLM (see nodelay.py)
LOADGEN = BENCH / "bench_loadgen.py"  # the load generator, run in a process of its own
MODEL = "tiny-llama"
PROMPT_FILLER = "Summarize the quarterly report of the northern fisheries cooperative. "
CLK_TCK = os.sysconf("SC_CLK_TCK")


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
        """Start ``argv``; a ``router`` runs on the router's core (benchmarks/router/cores.py)."""
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
            [str(PY), str(LOADGEN)],
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


# ====================================================================== fleet


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
