"""Harness of the real-vLLM suite: configs, ``narwhal serve`` / ``preflight`` as subprocesses.

Rule: Narwhal runs exactly as a user runs it, ``narwhal serve --config FILE`` in its own process
(from this checkout, with the project venv's Python), on a free 127.0.0.1 port, and is always
stopped by whoever started it. Engines come from :mod:`narwhal.vllm.processes`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import tomli_w

from narwhal.vllm.processes import EngineProcess, free_port
from narwhal.vllm.router_config import VLLM_VERSION, narwhal_config

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"

# Timeouts for 2 CPU cores: generous for the happy path, short where a test waits on them.
ENGINE_SETTINGS: dict[str, float] = {
    "first_token_timeout_s": 20.0,
    "decode_read_timeout_s": 10.0,
    "request_timeout_s": 120.0,
    "max_handoff_age_s": 25.0,
}
RECOVERY_SETTINGS: dict[str, float | int] = {"probe_interval_s": 1.0}


def config_text(
    producer: EngineProcess,
    consumer: EngineProcess,
    *,
    engine: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
    contract: dict[str, Any] | None = None,
    kv_endpoint: str | None = None,
) -> str:
    """A Narwhal TOML config for the pair; ``contract`` None pins the true contract."""
    return narwhal_config(
        producer.spec,
        consumer.spec,
        engine={**ENGINE_SETTINGS, **(engine or {})},
        recovery={**RECOVERY_SETTINGS, **(recovery or {})},
        contract=contract,
        kv_endpoint=kv_endpoint,
    )


def fleet_config_text(
    producers: list[EngineProcess],
    consumers: list[EngineProcess],
    *,
    routing: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
) -> str:
    """A Narwhal TOML config for several producers and consumers, each producer's NIXL side
    channel and the true contract pinned, with a ``[routing]`` section and ``recovery`` and
    ``engine`` settings over the suite's."""
    prefill = [
        {"url": p.url, "role": "prefill", "kv_endpoint": p.side_channel or ""} for p in producers
    ]
    data: dict[str, Any] = {
        "engine": {**ENGINE_SETTINGS, **(engine or {})},
        "recovery": {**RECOVERY_SETTINGS, **(recovery or {})},
        "engine_contract": {
            "model": MODEL,
            "vllm_version": VLLM_VERSION,
            "kv_connector": "NixlConnector",
        },
        "engines": prefill + [{"url": c.url, "role": "decode"} for c in consumers],
    }
    if routing:
        data["routing"] = routing
    return tomli_w.dumps(data)


def narwhal_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "narwhal.cli", *args]


def run_preflight(config_path: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        narwhal_cmd("preflight", "--config", str(config_path)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Narwhal:
    """One ``narwhal serve`` process."""

    config_path: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    seed: int = 0  # ``narwhal serve --seed``: every policy's randomness
    proc: subprocess.Popen[bytes] | None = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Narwhal:
        args = ("serve", "--config", str(self.config_path), "--port", str(self.port))
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                narwhal_cmd(*args, "--seed", str(self.seed), "--log-level", "info"),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"narwhal serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if self.http.get(self.url + "/status", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"narwhal serve not up after {timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.http.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def client(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=timeout
        )

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self.http.get(self.url + "/status").json()
        return data

    def metrics(self) -> str:
        """The router's ``GET /metrics`` (Prometheus text)."""
        return self.http.get(self.url + "/metrics").text

    def engine(self, url: str) -> dict[str, Any]:
        return next(e for e in self.status()["engines"] if e["url"] == url)

    def wait_engine(self, url: str, state: str, timeout: float) -> dict[str, Any]:
        """Poll ``/status`` until engine ``url`` is in ``state``; its entry."""
        end = time.monotonic() + timeout
        while True:
            entry = self.engine(url)
            if entry["state"] == state:
                return entry
            if time.monotonic() > end:
                raise AssertionError(f"{url} not {state} after {timeout} s: {self.status()}")
            time.sleep(0.2)
