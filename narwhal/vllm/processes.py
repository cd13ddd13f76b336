"""Start, stop, freeze and kill real vLLM engine processes (the CPU build) for tests and local
fleets.

Rule: every engine is its own process group, and every operation acts on the whole group. A vLLM
engine is three processes (API server, EngineCore, worker); killing only the API server leaves
the other two running for 20 s or more, holding memory, cores and the NIXL side channel. So
:class:`EngineProcess` starts ``vllm serve`` with ``start_new_session=True`` and signals the
group: ``stop`` (SIGTERM, then SIGKILL after a grace period), ``kill`` (SIGKILL: a crash),
``freeze``/``thaw`` (SIGSTOP/SIGCONT: a hung engine). Only 127.0.0.1 is ever bound.

Theory of operation. :class:`EngineSpec` says what one engine is (role, HTTP port, NIXL side
channel port, the core it is pinned to); :func:`engine_command` and :func:`engine_env` turn it
into the exact ``vllm serve`` command line and environment of the CPU recipe
(``--enforce-eager --dtype float32 --max-model-len 2048``, ``VLLM_CPU_KVCACHE_SPACE=1``,
``UCX_TLS=tcp UCX_NET_DEVICES=lo``, ``VLLM_CPU_OMP_THREADS_BIND``, a distinct
``VLLM_NIXL_SIDE_CHANNEL_PORT``, NIXL's progress thread slowed to 1000 us). Output goes to a log
file per engine; :meth:`EngineProcess.wait_healthy` polls ``GET /health`` and fails early, with
the log's tail, if the engine exits. :func:`start_engines` starts several at once (a
NixlConnector producer and consumer start in parallel: 50-70 s on 2 cores); :func:`pair_specs`
is that pair and :func:`start_single` one plain engine (no KV connector) for reference runs.
Ports come from :func:`free_port`, below the kernel's ephemeral range. Direct handoffs through
a running pair are the tests' (``tests/vllm/handoff.py``); a Narwhal config for one is
:mod:`narwhal.vllm.router_config`; ``narwhal vllm launch`` runs a pair until interrupted.

Uses only the standard library (the project venv runs it; the engines run in the vLLM venv).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from narwhal.vllm.env import DEFAULT_VENV, PTHR_DEFAULT_US, PTHR_ENV

MODEL_NAME = "tiny-llama"
HOST = "127.0.0.1"
HEALTH_TIMEOUT_S = 180.0
STOP_GRACE_S = 10.0
KvRole = Literal["kv_producer", "kv_consumer"]


class EngineError(RuntimeError):
    """An engine failed to start, died, or could not be reached."""


def _port_range() -> tuple[int, int]:
    """Ports to hand out: below the kernel's ephemeral range (where a bind to port 0 lands)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        ephemeral_low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    return (20000, ephemeral_low - 1) if ephemeral_low > 21000 else (61000, 65535)


_handed_out: set[int] = set()
_cursor: list[int] = []  # the next offset into the range (first use: derived from the pid)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for an engine to bind later.

    It comes from below the ephemeral range: an engine binds its ports seconds after they are
    chosen, and meanwhile vLLM's own internal sockets (and any client) bind port 0, which the
    kernel serves from the ephemeral range, so a port chosen there could be taken first (a
    consumer's NIXL side channel then fails with "Address already in use"). The scan
    starts at an offset derived from the process id, so concurrent runs start apart, and never
    hands out the same port twice in one process.
    """
    low, high = _port_range()
    span = high - low + 1
    if not _cursor:
        _cursor.append((os.getpid() * 7919) % span)
    for _ in range(span):
        port = low + _cursor[0]
        _cursor[0] = (_cursor[0] + 1) % span
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise EngineError(f"no free TCP port on {HOST} in {low}-{high}")


@dataclass(frozen=True)
class EngineSpec:
    """What one engine is. ``kv_role`` None: a plain engine with no KV connector."""

    name: str
    model_dir: Path
    port: int
    kv_role: KvRole | None = None
    side_channel_port: int | None = None
    cpu: str | None = None  # VLLM_CPU_OMP_THREADS_BIND, e.g. "0", "1", "0-1"
    kv_load_failure_policy: Literal["fail", "recompute"] | None = None
    served_model_name: str = MODEL_NAME
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def side_channel(self) -> str | None:
        """``host:port`` of the NIXL side channel (what a producer's descriptor names)."""
        return None if self.side_channel_port is None else f"{HOST}:{self.side_channel_port}"


def kv_transfer_config(spec: EngineSpec) -> dict[str, str] | None:
    if spec.kv_role is None:
        return None
    config = {"kv_connector": "NixlConnector", "kv_role": spec.kv_role, "kv_buffer_device": "cpu"}
    if spec.kv_load_failure_policy is not None:
        config["kv_load_failure_policy"] = spec.kv_load_failure_policy
    return config


def engine_command(spec: EngineSpec, venv: Path = DEFAULT_VENV) -> list[str]:
    """The ``vllm serve`` command line of ``spec``."""
    cmd = [
        str(venv / "bin" / "vllm"), "serve", str(spec.model_dir),
        "--host", HOST, "--port", str(spec.port),
        "--served-model-name", spec.served_model_name,
        "--max-model-len", "2048", "--dtype", "float32", "--enforce-eager",
    ]  # fmt: skip
    kv = kv_transfer_config(spec)
    if kv is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv)]
    return cmd + list(spec.extra_args)


def engine_env(spec: EngineSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of ``spec``'s engine: the CPU recipe, offline, loopback only."""
    env = dict(os.environ if base is None else base)
    for leaked in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(leaked, None)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_HOST_IP=HOST,
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env[PTHR_ENV] = env.get(PTHR_ENV, str(PTHR_DEFAULT_US))
    if spec.cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu
    if spec.kv_role is not None:
        assert spec.side_channel_port is not None, "a KV engine needs a side channel port"
        env.update(
            UCX_TLS="tcp",
            UCX_NET_DEVICES="lo",
            VLLM_NIXL_SIDE_CHANNEL_HOST=HOST,
            VLLM_NIXL_SIDE_CHANNEL_PORT=str(spec.side_channel_port),
        )
    return env


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """``GET url`` -> (status, body); raises :class:`EngineError` when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as error:
        raise EngineError(f"GET {url}: {error}") from error


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (Prometheus text) whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{key}="{wanted}"' in head for key, wanted in labels.items()):
            total += float(value)
    return total


@dataclass
class EngineProcess:
    """One running (or stopped) engine: its process group, log file and controls."""

    spec: EngineSpec
    log_path: Path
    venv: Path = DEFAULT_VENV
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def side_channel(self) -> str | None:
        return self.spec.side_channel

    # ------------------------------------------------------------ lifecycle

    def start(self) -> EngineProcess:
        """Launch ``vllm serve`` in a new process group (returns at once; see wait_healthy)."""
        if self.alive():
            raise EngineError(f"{self.spec.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {time.strftime('%H:%M:%S')}: ".encode())
            log.write((" ".join(engine_command(self.spec, self.venv)) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(
                engine_command(self.spec, self.venv),
                env=engine_env(self.spec),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            return http_get(self.url + "/health", timeout=2.0)[0] == 200
        except EngineError:
            return False

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT_S) -> float:
        """Block until ``GET /health`` answers 200; seconds since start. Fails fast if it dies."""
        end = time.monotonic() + timeout
        while not self.healthy():
            if not self.alive():
                raise EngineError(f"{self.spec.name} exited during start\n{self.log_tail()}")
            if time.monotonic() > end:
                raise EngineError(
                    f"{self.spec.name} not healthy after {timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.5)
        return time.monotonic() - self.started_at

    def group_pids(self) -> list[int]:
        """Live (not zombie) processes of the engine's group."""
        return [] if self.proc is None else group_members(self.proc.pid)

    def group_alive(self) -> bool:
        """Whether any process of the engine's group still runs."""
        return bool(self.group_pids())

    def signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the whole group (thawing it first), then SIGKILL what is left after grace."""
        if self.proc is None:
            return
        self.signal_group(signal.SIGTERM)
        self.signal_group(signal.SIGCONT)
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            self.proc.poll()
            if not self.group_alive():
                break
            time.sleep(0.1)
        else:
            self.signal_group(signal.SIGKILL)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the whole group at once: the engine crashes."""
        self.signal_group(signal.SIGKILL)
        self._reap()

    def _reap(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(timeout=timeout)
        end = time.monotonic() + timeout
        while self.group_alive() and time.monotonic() < end:
            time.sleep(0.05)

    def freeze(self) -> None:
        """SIGSTOP the whole group: it accepts TCP connections (the kernel does) but answers
        nothing, like a hung engine."""
        self.signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal_group(signal.SIGCONT)

    def restart(self, timeout: float = HEALTH_TIMEOUT_S) -> float:
        """Stop, start again on the same ports, wait until healthy; seconds it took."""
        self.stop()
        return self.start().wait_healthy(timeout)

    # ------------------------------------------------------------ observation

    def metrics(self) -> str:
        status, body = http_get(self.url + "/metrics")
        if status != 200:
            raise EngineError(f"GET {self.url}/metrics: HTTP {status}")
        return body

    def metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics(), name, **labels)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def start_engines(
    specs: Iterable[EngineSpec],
    log_dir: Path,
    venv: Path = DEFAULT_VENV,
    timeout: float = HEALTH_TIMEOUT_S,
) -> list[EngineProcess]:
    """Start every engine at once and wait until all are healthy (stop them all on failure)."""
    engines = [EngineProcess(spec, log_dir / f"{spec.name}.log", venv) for spec in specs]
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_healthy(timeout)
    except BaseException:
        stop_all(engines)
        raise
    return engines


def stop_all(engines: Sequence[EngineProcess]) -> None:
    """Stop engines in parallel: SIGTERM every group, then wait for each."""
    for engine in engines:
        engine.signal_group(signal.SIGTERM)
        engine.signal_group(signal.SIGCONT)
    for engine in engines:
        engine.stop()


def pair_specs(
    model_dir: Path,
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail",
    ports: tuple[int, int, int, int] | None = None,
) -> tuple[EngineSpec, EngineSpec]:
    """A NixlConnector producer (core 0) and consumer (core 1). ``ports`` = (producer HTTP,
    producer side channel, consumer HTTP, consumer side channel); None: free loopback ports."""
    p_http, p_side, c_http, c_side = ports or (free_port(), free_port(), free_port(), free_port())
    producer = EngineSpec("producer", model_dir, p_http, "kv_producer", p_side, cpu="0")
    consumer = EngineSpec(
        "consumer", model_dir, c_http, "kv_consumer", c_side, cpu="1",
        kv_load_failure_policy=kv_load_failure_policy,
    )  # fmt: skip
    return producer, consumer


def start_single(
    model_dir: Path,
    log_dir: Path,
    venv: Path = DEFAULT_VENV,
    cpu: str | None = None,
    timeout: float = HEALTH_TIMEOUT_S,
) -> EngineProcess:
    """One plain engine (no KV connector), e.g. for a reference greedy run."""
    spec = EngineSpec("single", model_dir, free_port(), cpu=cpu)
    return start_engines([spec], log_dir, venv, timeout)[0]
