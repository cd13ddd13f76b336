"""Reloading a live router's configuration over 127.0.0.1: engines join after a passing probe,
removed ones drain while their streams finish, and a bad file keeps the router serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import tomli_w

from narwhal.config_file import load_config
from narwhal.core.policies import Policies
from narwhal.emulator.timing import LinearTiming
from narwhal.live.app import Router
from narwhal.live.clock import AnyioClock
from narwhal.live.reload import ConfigReloader
from narwhal.live.serving import make_router_server
from narwhal.serving import BackgroundServer, bind, port_of
from tests.live.conftest import HTTP, Emulator, RouterHandle, Servers, metric_value

REPO = Path(__file__).resolve().parents[2]
ENGINE = {
    "first_token_timeout_s": 2.0,
    "decode_read_timeout_s": 1.0,
    "request_timeout_s": 10.0,
    "max_handoff_age_s": 2.0,
}


def write_config(path: Path, engines: list[Emulator | tuple[Emulator, str]], **extra: Any) -> None:
    """The router's TOML file: a producer first, then consumers; replaced atomically."""
    listed = []
    for item in engines:
        emulator, role = item if isinstance(item, tuple) else (item, "decode")
        entry = {"url": emulator.url, "role": role}
        if role == "prefill":
            entry["kv_endpoint"] = emulator.side_channel
        listed.append(entry)
    data = {"engine": ENGINE, "recovery": {"probe_interval_s": 0.2}, "engines": listed, **extra}
    staged = path.with_suffix(".new")
    staged.write_text(tomli_w.dumps(data))
    staged.replace(path)


def start_from_file(
    servers: Servers, path: Path, said: list[str], poll_s: float = 0.0
) -> RouterHandle:
    router = Router(
        load_config(path),
        tick_s=0.02,
        announce=said.append,
        config_path=path,
        reload_poll_s=poll_s,
    )
    sock = bind("127.0.0.1", 0)
    built = make_router_server(router, client=router.config.client, graceful_s=0.2)
    server = servers.start(BackgroundServer(built, [sock]))
    return RouterHandle(router, server, f"http://127.0.0.1:{port_of(sock)}")


def reloads(handle: RouterHandle, result: str) -> float:
    return metric_value(handle.metrics(), "narwhal_config_reloads_total", result=result)


def placements(handle: RouterHandle, engine: Emulator) -> float:
    text = handle.metrics()
    return metric_value(text, "narwhal_placements_total", engine=engine.url, phase="decode")


def stream_in_background(url: str, got: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        body = {"prompt": "hi", "max_tokens": 12, "stream": True}
        with (
            httpx.Client(timeout=20) as client,
            client.stream("POST", url + "/v1/completions", json=body) as reply,
        ):
            got["status"] = reply.status_code
            got["events"] = []
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    got["events"].append(line[6:])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def state_of(handle: RouterHandle, engine: Emulator) -> str | None:
    """The engine's state in /status (None: not listed)."""
    listed = [e["state"] for e in handle.status()["engines"] if e["url"] == engine.url]
    return listed[0] if listed else None


def complete(handle: RouterHandle) -> int:
    reply = HTTP.post(handle.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    return reply.status_code


def test_an_engine_added_joins_and_a_removed_one_drains_its_stream_in_flight(
    tmp_path: Path, emulator: Callable[..., Emulator], servers: Servers
) -> None:
    producer = emulator("prefill")
    old = emulator("decode", timing=LinearTiming(decode_s_per_token=0.1))  # 12 tokens: 1.2 s
    new = emulator("decode")
    path = tmp_path / "narwhal.toml"
    write_config(path, [(producer, "prefill"), old])
    said: list[str] = []
    handle = start_from_file(servers, path, said)
    got: dict[str, Any] = {}
    thread = stream_in_background(handle.url, got)
    handle.wait_for(lambda: len(got.get("events", [])) >= 1)  # committed, on the old engine

    write_config(path, [(producer, "prefill"), new])
    assert handle.router.reloader is not None
    handle.router.reloader.request_from_thread()  # what the SIGHUP handler calls
    handle.wait_for(lambda: reloads(handle, "applied") == 1)
    assert handle.engine(old.url)["state"] == "draining"
    assert handle.engine(old.url)["reservations"]["decode"] == 1  # the stream still runs
    handle.wait_for(lambda: state_of(handle, new) == "ready")  # its probe passed

    thread.join(10)
    assert got["status"] == 200 and got["events"][-1] == "[DONE]"  # the stream finished
    assert not any("error" in event for event in got["events"][:-1])
    handle.wait_for(lambda: state_of(handle, old) is None)  # drained, then forgotten
    before = placements(handle, old)
    for _ in range(3):
        assert complete(handle) == 200
    assert placements(handle, new) == 3 and placements(handle, old) == before == 1
    assert any("joining " + new.url in line for line in said)
    assert any(f"engine {old.url} drained and removed" in line for line in said)


def test_an_invalid_or_unreloadable_file_keeps_the_router_serving(
    tmp_path: Path, emulator: Callable[..., Emulator], servers: Servers
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    path = tmp_path / "narwhal.toml"
    write_config(path, [(producer, "prefill"), consumer])
    said: list[str] = []
    handle = start_from_file(servers, path, said)
    reloader = handle.router.reloader
    assert reloader is not None

    path.write_text("[[engines]]\nurl = 'ftp://nowhere'\n")
    reloader.request_from_thread()
    handle.wait_for(lambda: reloads(handle, "invalid") == 1)
    assert complete(handle) == 200
    assert "keeping the previous configuration" in said[-1] and "engines[0].url" in said[-1]

    write_config(path, [(producer, "prefill"), consumer], admission={"retry_after_s": 5})
    reloader.request_from_thread()
    handle.wait_for(lambda: reloads(handle, "refused") == 1)
    assert "admission.retry_after_s: not reloadable" in said[-1]
    assert handle.router.config.admission.retry_after_s == 1
    assert [e["state"] for e in handle.status()["engines"]] == ["ready", "ready"]
    assert complete(handle) == 200


def test_a_rewritten_file_is_reloaded_without_a_signal(
    tmp_path: Path, emulator: Callable[..., Emulator], servers: Servers
) -> None:
    producer, first, second = emulator("prefill"), emulator("decode"), emulator("decode")
    path = tmp_path / "narwhal.toml"
    write_config(path, [(producer, "prefill"), first])
    said: list[str] = []
    handle = start_from_file(servers, path, said, poll_s=0.05)
    write_config(path, [(producer, "prefill"), first, second])
    handle.wait_for(lambda: state_of(handle, second) == "ready")
    assert reloads(handle, "applied") == 1
    assert [e["url"] for e in handle.status()["engines"]] == [producer.url, first.url, second.url]


def test_narwhal_serve_reloads_on_sighup(tmp_path: Path, emulator: Callable[..., Emulator]) -> None:
    producer, first, second = emulator("prefill"), emulator("decode"), emulator("decode")
    path = tmp_path / "narwhal.toml"
    write_config(path, [(producer, "prefill"), first])
    sock = bind("127.0.0.1", 0)
    port = port_of(sock)
    sock.close()
    command = [sys.executable, "-m", "narwhal.cli", "serve", "--config", str(path)]
    command += ["--port", str(port), "--graceful-s", "1", "--reload-poll-s", "0"]
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if HTTP.get(url + "/livez", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "narwhal serve did not come up"
                time.sleep(0.05)
        write_config(path, [(producer, "prefill"), second])
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            engines = {e["url"]: e["state"] for e in HTTP.get(url + "/status").json()["engines"]}
            if engines == {producer.url: "ready", second.url: "ready"}:
                break
            assert time.monotonic() < deadline, engines
            time.sleep(0.05)
        assert HTTP.post(url + "/v1/completions", json={"prompt": "hi"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    applied = f"reload of {path}: applied: joining {second.url}; removed (it held nothing) "
    assert applied + first.url in err, err
    events = [json.loads(line) for line in out.splitlines()]
    # a router line at start and after the reload (the fleet in force: for a replay)
    assert [e["event"] for e in events] == ["router", "router", "request"]
    assert [[engine["url"] for engine in e["engines"]] for e in events[:2]] == [
        [producer.url, first.url],
        [producer.url, second.url],
    ]


def test_a_touched_file_with_the_same_content_is_not_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.toml"
    path.write_text(
        "[[engines]]\nurl = 'http://p:1'\nrole = 'prefill'\n"
        "[[engines]]\nurl = 'http://d:1'\nrole = 'decode'\n"
    )
    policies = Policies(load_config(path))
    reloader = ConfigReloader(path, policies, AnyioClock(), poll_s=0.05)

    async def check() -> list[bool]:
        seen = [await reloader.changed()]  # as started
        os.utime(path, ns=(1, 1))  # a new mtime, the same bytes
        seen.append(await reloader.changed())
        path.write_text(path.read_text() + "# a comment\n")
        seen.append(await reloader.changed())
        return seen

    assert anyio.run(check) == [False, False, True]


def test_narwhal_serve_refuses_a_negative_reload_poll(tmp_path: Path) -> None:
    path = tmp_path / "narwhal.toml"
    path.write_text("[[engines]]\nurl = 'http://p:1'\nrole = 'both'\n")
    command = [sys.executable, "-m", "narwhal.cli", "serve", "--config", str(path)]
    done = subprocess.run(
        [*command, "--reload-poll-s", "-1"], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "--reload-poll-s must be within 0..3600" in done.stderr
