"""(default run, no vLLM) The engine launcher (``narwhal.vllm.processes``): the engine command
line and environment, metrics, free ports, and process-group control on a fake ``vllm`` whose
API server spawns a child (the EngineCore stand-in)."""

from __future__ import annotations

import json
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal.vllm.processes import (
    EngineError,
    EngineProcess,
    EngineSpec,
    engine_command,
    engine_env,
    free_port,
    group_members,
    metric_sum,
)
from tests.vllm.fakes import fake_venv


def test_engine_command_and_env_follow_the_cpu_recipe(tmp_path: Path) -> None:
    spec = EngineSpec("p", tmp_path, 8100, "kv_producer", 5559, cpu="0")
    cmd = engine_command(spec, tmp_path / "venv")
    assert cmd[:3] == [str(tmp_path / "venv" / "bin" / "vllm"), "serve", str(tmp_path)]
    text = " ".join(cmd)
    for part in ("--host 127.0.0.1", "--port 8100", "--served-model-name tiny-llama",
                 "--max-model-len 2048", "--dtype float32", "--enforce-eager"):  # fmt: skip
        assert part in text
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                  "kv_buffer_device": "cpu"}  # fmt: skip
    env = engine_env(spec, {"PATH": "/bin", "VIRTUAL_ENV": "/x"})
    assert "VIRTUAL_ENV" not in env
    assert env["UCX_TLS"] == "tcp" and env["UCX_NET_DEVICES"] == "lo"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5559"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["NIXL_PTHR_DELAY_US"] == "1000"
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    plain = EngineSpec("s", tmp_path, 8300)
    assert "--kv-transfer-config" not in engine_command(plain)
    assert "UCX_TLS" not in engine_env(plain, {})
    assert spec.side_channel == "127.0.0.1:5559" and plain.side_channel is None


def test_metric_sum_adds_matching_samples() -> None:
    text = textwrap.dedent("""\
        # HELP x_total help
        x_total{engine="0",source="a"} 3.0
        x_total{engine="0",source="b"} 4.0
        x_total_created{engine="0",source="a"} 1.7e9
        """)
    assert metric_sum(text, "x_total") == 7.0
    assert metric_sum(text, "x_total", source="b") == 4.0
    assert metric_sum(text, "y_total") == 0.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[EngineProcess]:
    venv = fake_venv(tmp_path / "venv")
    model = tmp_path / "model"
    model.mkdir()
    spec = EngineSpec("fake", model, free_port(), "kv_consumer", free_port(), cpu="1")
    engine = EngineProcess(spec, tmp_path / "fake.log", venv)
    try:
        yield engine
    finally:
        engine.stop(grace_s=2)  # thaws and ends whatever a failed test left behind


def state_of(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat[stat.rfind(")") + 2]


def wait_state(pid: int, states: str, timeout: float = 5.0) -> str:
    """Signals are delivered asynchronously: poll until ``pid`` is in one of ``states``."""
    end = time.monotonic() + timeout
    while (state := state_of(pid)) not in states and time.monotonic() < end:
        time.sleep(0.01)
    return state


def test_stop_ends_the_whole_group(fake: EngineProcess) -> None:
    fake.start().wait_healthy(timeout=20)
    child = int((fake.spec.model_dir / f"child-{fake.spec.port}.pid").read_text())
    assert fake.proc is not None
    assert set(group_members(fake.proc.pid)) == {fake.proc.pid, child}
    fake.freeze()
    assert wait_state(child, "T") == "T" and wait_state(fake.proc.pid, "T") == "T"
    fake.thaw()
    assert wait_state(child, "SR") in "SR"
    assert fake.healthy()
    fake.stop(grace_s=5)  # the child (an EngineCore stand-in) goes too
    assert not fake.group_alive()
    assert state_of(child) in ("gone", "Z")


def test_kill_and_restart_on_the_same_port(fake: EngineProcess) -> None:
    fake.start().wait_healthy(timeout=20)
    fake.kill()
    assert not fake.group_alive() and not fake.healthy()
    fake.restart(timeout=20)
    assert fake.healthy()
    fake.stop(grace_s=5)


def test_stop_thaws_a_frozen_group(fake: EngineProcess) -> None:
    fake.start().wait_healthy(timeout=20)
    fake.freeze()
    assert fake.proc is not None and wait_state(fake.proc.pid, "T") == "T"
    started = time.monotonic()
    fake.stop(grace_s=5)
    assert not fake.group_alive()
    assert time.monotonic() - started < 5  # SIGTERM took effect: no SIGKILL after the grace


def test_an_engine_that_exits_fails_fast_with_its_log(
    fake: EngineProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    started = time.monotonic()
    with pytest.raises(EngineError, match="refusing to start"):
        fake.start().wait_healthy(timeout=60)
    assert time.monotonic() - started < 15
    assert fake.proc is not None and fake.proc.returncode == 3
    fake.stop()


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    low, high = int(ephemeral[0]), int(ephemeral[1])
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20  # never the same port twice in a process
    assert not any(low <= port <= high for port in ports)  # a bind to port 0 cannot take them
    for port in ports[:3]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free when handed out
