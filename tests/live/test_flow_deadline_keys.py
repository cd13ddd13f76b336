"""Flow control over real HTTP, the real router in front of emulators: a queued request whose
request deadline passes before its queue TTL leaves the queue with the deadline's answer (504,
no engine charged); a band taken from the client's API key (``flow.api_key_priorities``) is
dispatched ahead of a lower band's queued requests."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from narwhal.core.flow import REASONS
from narwhal.emulator.timing import LinearTiming
from tests.live.conftest import Emulator, RouterHandle, metric_value
from tests.live.test_flow_live import MODEL, hold, post, queued


@pytest.fixture
def pair(emulator: Callable[..., Emulator]) -> tuple[list[dict[str, Any]], Emulator]:
    producer = emulator("prefill")
    consumer = emulator("decode", timing=LinearTiming(decode_s_per_token=0.05))  # 150: 7.5 s
    engines = [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]
    return engines, consumer


def read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole HTTP/1.1 response (the request asked to close the connection after it)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_a_queued_request_leaves_at_its_request_deadline_with_the_deadline_answer(
    router: Callable[..., RouterHandle],
    pair: tuple[list[dict[str, Any]], Emulator],
) -> None:
    engines, consumer = pair
    handle = router(
        engines,
        engine={"request_timeout_s": 2.0},
        admission={"max_requests_in_flight": 1},
        flow={"enabled": True, "queue_ttl_s": 30.0, "saturation_gate": False},
    )
    host, port = handle.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": "late", "max_tokens": 5}).encode()
    # the late request's deadline runs from its head: send the head first, the body later,
    # so that it queues behind a holder whose own deadline comes after its own. The router's
    # interim 100 Continue says it has read the head and begun handling it.
    late = socket.create_connection((host, int(port)), timeout=10)
    late.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"expect: 100-continue\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    head_sent = time.monotonic()
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):  # bounded by the socket's 10 s timeout
        interim += late.recv(1)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
    first: list[Any] = []
    leave = threading.Event()
    holder = threading.Thread(target=hold, args=(handle.url, leave, first))
    holder.start()
    try:
        handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 1)
        late.sendall(body)
        handle.wait_for(lambda: queued(handle, "0") == 1)
        status, headers, content = read_reply(late)
        answered = time.monotonic() - head_sent
    finally:
        late.close()
        leave.set()
        holder.join(timeout=10)
    error = json.loads(content)["error"]
    assert status == 504 and "retry-after" not in headers, (status, headers, content)
    assert error["type"] == "request_timeout" and "(deadline)" in error["message"]
    assert "engine.request_timeout_s = 2 s" in error["message"]
    assert 2.0 <= answered < 3.5  # at its deadline, not at the 30 s TTL
    assert first == [200]  # the holder kept its slot throughout
    flow = handle.status()["flow"]["0"]
    assert flow["queue_length"] == 0 and flow["dispatched"] == 1  # the holder only
    assert flow["refused"] == {**dict.fromkeys(REASONS, 0), "deadline": 1}
    logged = [r for r in handle.logged_requests() if r["status"] == 504]
    assert len(logged) == 1 and logged[0]["outcome"] == "deadline"
    assert logged[0]["engines"] == [] and logged[0]["attempts"] == 0
    for engine in handle.status()["engines"]:  # no engine is charged for it
        assert engine["failure_streak"] == 0
    assert consumer.app.engine.counts["requests"] == 1  # the holder's decode, nothing else
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_flow_refused_total", band="0", reason="deadline") == 1


def test_an_api_key_mapped_to_a_band_is_dispatched_ahead_of_a_lower_band(
    router: Callable[..., RouterHandle],
    pair: tuple[list[dict[str, Any]], Emulator],
) -> None:
    engines, _ = pair
    handle = router(
        engines,
        engine={"request_timeout_s": 30.0},
        admission={"max_requests_in_flight": 1},
        flow={
            "enabled": True,
            "queue_ttl_s": 30.0,
            "saturation_gate": False,
            "api_key_priorities": {"gold-key": 5, "batch-key": -2},
        },
    )
    url = handle.url
    first: list[Any] = []
    leave = threading.Event()
    holder = threading.Thread(target=hold, args=(url, leave, first))
    holder.start()
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 1)
    done: list[tuple[str, int]] = []
    lock = threading.Lock()

    def send(name: str, key: str) -> None:
        out: list[Any] = []
        post(url, 5, {"authorization": f"Bearer {key}"}, out, 30.0)
        with lock:
            done.append((name, out[0][0]))

    # two plain-key requests (default band 0) and one batch-key request (band -2) queue first,
    # then the gold key's request (band 5): it is served first, the batch one last
    threads = []
    for name, key, band, count in (
        ("plain-1", "plain-key", "0", 1),
        ("plain-2", "plain-key", "0", 2),
        ("batch", "batch-key", "-2", 1),
        ("gold", "gold-key", "5", 1),
    ):
        thread = threading.Thread(target=send, args=(name, key))
        thread.start()
        threads.append(thread)
        handle.wait_for(lambda band=band, count=count: queued(handle, band) == count)
    leave.set()
    for thread in [holder, *threads]:
        thread.join(timeout=30)
    assert first == [200]
    assert done == [("gold", 200), ("plain-1", 200), ("plain-2", 200), ("batch", 200)]
    flow = handle.status()["flow"]
    assert {band: flow[band]["dispatched"] for band in ("5", "0", "-2")} == {
        "5": 1,
        "0": 3,
        "-2": 1,
    }
