"""Loopback harness: emulated engines (uvicorn) and routers (h1server) in background threads.

Every server is started through a fixture that stops it at teardown, so nothing outlives a test.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import openai
import pytest

from narwhal.core.config import Role, parse_config
from narwhal.emulator.app import EmulatorApp
from narwhal.emulator.faults import FaultSpec
from narwhal.emulator.runner import build_emulator
from narwhal.emulator.state import EmulatorConfig
from narwhal.emulator.timing import LinearTiming
from narwhal.live.app import Router
from narwhal.live.serving import make_router_server
from narwhal.serving import BackgroundServer, bind, port_of

FAST_ENGINE = {
    "first_token_timeout_s": 0.5,
    "decode_read_timeout_s": 0.3,
    "request_timeout_s": 5.0,
    "max_handoff_age_s": 0.5,
}


HTTP = httpx.Client(timeout=10)  # one pool for the harness: a client per call costs ~30 ms


@dataclass
class Emulator:
    app: EmulatorApp
    server: BackgroundServer
    url: str
    side_channel: str

    def faults(self, *faults: dict[str, Any], replace: bool = True) -> None:
        response = HTTP.post(
            self.url + "/admin/faults", json={"faults": list(faults), "replace": replace}
        )
        response.raise_for_status()

    def clear(self) -> None:
        HTTP.delete(f"http://{self.side_channel}/admin/faults").raise_for_status()

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = HTTP.get(f"http://{self.side_channel}/admin/state").json()
        return data


@dataclass
class RouterHandle:
    router: Router
    server: BackgroundServer
    url: str
    request_lines: list[bytes] = field(default_factory=list)  # the request log, as written

    def logged(self) -> list[dict[str, Any]]:
        """The JSON log's lines so far, each one JSON object ending in a newline."""
        assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in self.request_lines)
        return [json.loads(line) for line in self.request_lines]

    def logged_requests(self) -> list[dict[str, Any]]:
        """The request lines of the JSON log (not its engine-health lines)."""
        return [line for line in self.logged() if line["event"] == "request"]

    def client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("api_key", "unused")
        return openai.OpenAI(
            base_url=self.url + "/v1", max_retries=0, timeout=10, http_client=HTTP, **kwargs
        )

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = HTTP.get(self.url + "/status").json()
        return data

    def engine(self, url: str) -> dict[str, Any]:
        return next(e for e in self.status()["engines"] if e["url"] == url)

    def metrics(self) -> str:
        return HTTP.get(self.url + "/metrics").text

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end:
                raise AssertionError(f"condition not met within {timeout} s: {self.status()}")
            time.sleep(0.02)


class Servers:
    """Servers started by one test; all stopped together (in parallel) at teardown."""

    def __init__(self) -> None:
        self.started: list[BackgroundServer] = []

    def start(self, server: BackgroundServer) -> BackgroundServer:
        server.start()
        self.started.append(server)
        return server

    def stop_all(self) -> None:
        for server in self.started:
            server.server.should_exit = True
        for server in self.started:
            server.stop()


@pytest.fixture
def servers() -> Iterator[Servers]:
    running = Servers()
    try:
        yield running
    finally:
        running.stop_all()


@pytest.fixture(scope="module")
def module_servers() -> Iterator[Servers]:
    """Servers shared by the tests of one module (each test resets what it changed)."""
    running = Servers()
    try:
        yield running
    finally:
        running.stop_all()


def start_emulator(
    servers: Servers,
    role: str = "both",
    faults: list[FaultSpec] | None = None,
    timing: LinearTiming | None = None,
    **options: Any,
) -> Emulator:
    """An emulated engine on free loopback ports (HTTP and KV side channel)."""
    config = EmulatorConfig(role=Role(role), timing=timing or LinearTiming(), **options)
    built = build_emulator(config, faults, graceful_s=0.2)
    server = servers.start(BackgroundServer(built.server, built.sockets))
    return Emulator(built.app, server, built.url, built.side_channel)


@pytest.fixture
def emulator(servers: Servers) -> Callable[..., Emulator]:
    return partial(start_emulator, servers)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0.0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


def start_router(
    servers: Servers,
    engines: list[dict[str, Any]],
    *,
    engine: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
    contract: dict[str, Any] | None = None,
    routing: dict[str, Any] | None = None,
    api_key: str | None = None,
    seed: int = 0,
    max_body_bytes: int | None = None,
    admission: dict[str, Any] | None = None,
    announce: Callable[[str], None] | None = None,
    client: dict[str, Any] | None = None,
    send_buffer: int | None = None,
    flow: dict[str, Any] | None = None,
) -> RouterHandle:
    """A live router on a free loopback port, with short test timeouts (:data:`FAST_ENGINE`).

    ``send_buffer``: the kernel send buffer of the router's client connections (small: a
    client that stops reading blocks the router's writes after kilobytes, not megabytes)."""
    data: dict[str, Any] = {
        "engine": {**FAST_ENGINE, **(engine or {})},
        "recovery": {"probe_interval_s": 0.2, **(recovery or {})},
        "engines": engines,
    }
    if client is not None:
        data["client"] = client
    if contract is not None:
        data["engine_contract"] = contract
    if routing is not None:
        data["routing"] = routing
    data["admission"] = dict(admission or {})
    if flow is not None:
        data["flow"] = flow
    if max_body_bytes is not None:
        data["admission"]["max_body_bytes"] = max_body_bytes
    lines: list[bytes] = []
    app = Router(
        parse_config(data),
        seed=seed,
        api_key=api_key,
        tick_s=0.02,
        announce=announce,
        request_log=lines.append,
    )
    sock = bind("127.0.0.1", 0)
    if send_buffer is not None:  # accepted connections inherit it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    # as `narwhal serve` runs it
    server = make_router_server(app, client=app.config.client, graceful_s=0.2)
    background = servers.start(BackgroundServer(server, [sock]))
    return RouterHandle(app, background, f"http://127.0.0.1:{port_of(sock)}", lines)


@pytest.fixture
def router(servers: Servers) -> Callable[..., RouterHandle]:
    return partial(start_router, servers)
