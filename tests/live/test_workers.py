"""``narwhal serve --workers N`` as processes over 127.0.0.1: every worker answers on the one
port, a signal to the supervisor stops them all, a worker that dies stops the router (exit 1),
a bad count is refused, and each worker's ``/status`` counts its own client connections only.
Waits poll with a bound."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import tomli_w

from narwhal.serving import bind, port_of
from tests.live.conftest import Emulator
from tests.live.test_connections import ask, wait_for

REPO = Path(__file__).resolve().parents[2]
WORKER = re.compile(r'^narwhal_worker\{pid="(\d+)",worker="(\d+)"\} 1\.0$', re.M)


def poll(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Served:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.workers: dict[int, int] = {}  # worker index -> pid

    def scrape(self) -> bool:
        """One /metrics over a fresh connection; records which worker answered."""
        try:
            text = httpx.get(self.url + "/metrics", timeout=2).text
        except httpx.HTTPError:
            return False
        for pid, worker in WORKER.findall(text):
            self.workers[int(worker)] = int(pid)
        return True


@pytest.fixture
def serve(tmp_path: Path, emulator: Callable[..., Emulator]) -> Iterator[Callable[[int], Served]]:
    producer, consumer = emulator("prefill"), emulator("decode")
    config = tmp_path / "narwhal.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "engines": [
                    {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
                    {"url": consumer.url, "role": "decode"},
                ]
            }
        )
    )
    started: list[Served] = []

    def start(workers: int) -> Served:
        sock = bind("127.0.0.1", 0)
        port = port_of(sock)
        sock.close()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "narwhal.cli",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--graceful-s",
                "1",
                "--workers",
                str(workers),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        served = Served(proc, port)
        started.append(served)
        return served

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
        served.proc.communicate(timeout=30)
        for pid in served.workers.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def both_answer(served: Served) -> None:
    poll(
        lambda: served.proc.poll() is not None or (served.scrape() and len(served.workers) == 2),
        "both workers to answer a scrape",
    )
    assert served.proc.poll() is None
    reply = httpx.post(
        served.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10
    )
    assert reply.status_code == 200


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_two_workers_answer_on_one_port_and_a_signal_stops_both(
    serve: Callable[[int], Served], signum: int
) -> None:
    served = serve(2)
    both_answer(served)
    assert sorted(served.workers) == [0, 1] and len(set(served.workers.values())) == 2
    served.proc.send_signal(signum)
    assert served.proc.wait(timeout=30) == 0
    poll(lambda: not any(alive(pid) for pid in served.workers.values()), "workers to exit")


def test_each_worker_counts_its_own_client_connections(serve: Callable[[int], Served]) -> None:
    served = serve(2)
    both_answer(served)
    host, port = served.url.removeprefix("http://").split(":")
    held: dict[int, socket.socket] = {}  # worker index -> a kept-alive connection it accepted
    extra: list[socket.socket] = []
    deadline = time.monotonic() + 30.0
    try:
        while len(held) < 2:
            assert time.monotonic() < deadline, "timed out holding a connection to each worker"
            sock = socket.create_connection((host, int(port)), timeout=5.0)
            found = WORKER.search(ask(sock, "/metrics").decode())
            assert found is not None
            if int(found.group(2)) in held:
                extra.append(sock)
            else:
                held[int(found.group(2))] = sock
        for sock in extra:
            sock.close()
        for sock in held.values():  # two client connections to the router, one on each worker
            counts = wait_for(sock, open=1)
            assert counts["max_connections"] == 4096 and counts["refused"] == 0
    finally:
        for sock in (*held.values(), *extra):
            sock.close()


def process_states(pids: list[int]) -> str:
    """Each pid's state line from /proc (gone if it has exited), for a failure's message."""
    states = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                state = next(line for line in status if line.startswith("State:"))
            states.append(f"{pid} {state.strip()}")
        except (FileNotFoundError, StopIteration):
            states.append(f"{pid} gone")
    return "; ".join(states)


# A failure says what each process was doing and what the supervisor wrote. The moment the
# supervisor first sees the killed worker dead is chance; tests/live/test_supervisor_races.py
# drives the moment that once lost it.
def test_a_worker_that_dies_stops_the_router_with_an_error(serve: Callable[[int], Served]) -> None:
    served = serve(2)
    both_answer(served)
    os.kill(served.workers[1], signal.SIGKILL)
    try:
        served.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        states = process_states([served.proc.pid, *served.workers.values()])
        served.proc.kill()
        _, err = served.proc.communicate(timeout=5)
        pytest.fail(f"the supervisor did not exit: {states}; its stderr: {err[-2000:]!r}")
    assert served.proc.returncode == 1
    poll(lambda: not alive(served.workers[0]), "the other worker to stop")
    _, err = served.proc.communicate(timeout=5)
    assert "narwhal-worker-1" in err and "stopping the others" in err


def test_a_worker_count_out_of_range_is_refused(serve: Callable[[int], Served]) -> None:
    served = serve(65)
    assert served.proc.wait(timeout=30) == 2
    _, err = served.proc.communicate(timeout=5)
    assert "--workers must be within 1..64" in err
