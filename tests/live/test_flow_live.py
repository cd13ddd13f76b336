"""Flow control over real HTTP, the real router in front of emulators: a queued request that
its client abandons leaves the queue (and holds nothing); the queue bound holds under a burst;
a queued request past flow.queue_ttl_s gets 503 + Retry-After naming the reason; /health
answers at once throughout; per-band metrics and /status report the queue."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from narwhal.core.flow import REASONS
from narwhal.emulator.timing import LinearTiming
from tests.live.conftest import Emulator, RouterHandle, metric_value

MODEL = "tiny-llama"
SLOW = LinearTiming(decode_s_per_token=0.02)  # a stream of 150 tokens lasts about 3 s


@pytest.fixture
def pair(emulator: Callable[..., Emulator]) -> list[dict[str, Any]]:
    producer, consumer = emulator("prefill"), emulator("decode", timing=SLOW)
    return [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]


def queued(handle: RouterHandle, band: str) -> int | None:
    """Band ``band``'s queue length (None: the band has seen no request yet)."""
    flow = handle.status()["flow"]
    return flow[band]["queue_length"] if band in flow else None


def post(url: str, tokens: int, headers: dict[str, str], out: list[Any], timeout: float) -> None:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": tokens, "stream": True}
    try:
        with httpx.Client(timeout=timeout) as client:
            reply = client.post(url + "/v1/completions", json=body, headers=headers)
            out.append((reply.status_code, reply.headers, reply.content))
    except httpx.HTTPError as error:
        out.append(error)


def hold(url: str, leave: threading.Event, out: list[Any]) -> None:
    """A long stream whose client reads it until ``leave`` is set, then hangs up."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 150, "stream": True}
    with (
        httpx.Client(timeout=30.0) as client,
        client.stream("POST", url + "/v1/completions", json=body) as reply,
    ):
        out.append(reply.status_code)
        for _ in reply.iter_bytes():
            if leave.is_set():
                break


def test_disconnect_bound_and_health_under_a_burst(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> None:
    producer = emulator("prefill")
    consumer = emulator("decode", timing=LinearTiming(decode_s_per_token=0.2))  # 150: 30 s
    pair = [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]
    handle = router(
        pair,
        engine={"request_timeout_s": 60.0},
        admission={"max_requests_in_flight": 1, "retry_after_s": 2},
        flow={
            "enabled": True,
            "max_queue_per_band": 5,
            "queue_ttl_s": 60.0,
            "saturation_gate": False,
        },
    )
    url = handle.url
    first: list[Any] = []  # holds the one slot 30 s, unless its client leaves first
    leave = threading.Event()
    holder = threading.Thread(target=hold, args=(url, leave, first))
    holder.start()
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 1)

    # a client that gives up while queued: its ticket leaves the queue, refused by nobody
    gone: list[Any] = []
    quitter = threading.Thread(target=post, args=(url, 5, {"x-narwhal-priority": "1"}, gone, 0.3))
    quitter.start()
    quitter.join(timeout=5)
    assert gone and isinstance(gone[0], httpx.TimeoutException)
    handle.wait_for(lambda: queued(handle, "1") == 0)
    assert handle.status()["flow"]["1"]["refused"] == dict.fromkeys(REASONS, 0)

    # a burst of 60 sheddable requests: 5 wait (the band's bound), 55 are refused at once
    burst: list[list[Any]] = [[] for _ in range(60)]
    threads = [
        threading.Thread(target=post, args=(url, 5, {"x-narwhal-priority": "-1"}, out, 30.0))
        for out in burst
    ]
    for thread in threads:
        thread.start()
    handle.wait_for(lambda: sum(1 for out in burst if out) == 55, timeout=10)
    assert queued(handle, "-1") == 5, handle.status()["flow"]
    started = time.monotonic()
    health = httpx.get(url + "/health", timeout=5)
    assert health.status_code == 200 and time.monotonic() - started < 1.0
    assert handle.status()["admission"]["in_flight"] == 1  # the queue holds no slot
    refused = [out[0] for out in burst if out]
    for status, headers, content in refused:
        error = json.loads(content)["error"]
        assert status == 503 and headers["retry-after"] == "2"
        assert error["type"] == "router_shed" and "(queue_full)" in error["message"]

    # the holder's client leaves: its slot frees and the 5 queued are served in turn
    leave.set()
    holder.join(timeout=15)
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(out[0][0] for out in burst) == [200] * 5 + [503] * 55
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 0)
    status = handle.status()
    assert status["flow"]["-1"]["refused"] == {**dict.fromkeys(REASONS, 0), "queue_full": 55}
    assert status["flow"]["-1"]["dispatched"] == 5
    for engine in status["engines"]:  # nothing of it is an engine's fault
        assert engine["failure_streak"] == 0
        assert engine["reservations"] == {"prefill": 0, "decode": 0}
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_flow_refused_total", band="-1", reason="queue_full") == 55
    assert metric_value(metrics, "narwhal_flow_dispatched_total", band="-1") == 5
    assert metric_value(metrics, "narwhal_flow_queue_length", band="-1") == 0
    assert metric_value(metrics, "narwhal_requests_total", outcome="shed", status="503") == 55


def test_a_request_queued_past_its_ttl_gets_503_naming_the_reason(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(
        pair,
        admission={"max_requests_in_flight": 1, "retry_after_s": 3},
        flow={"enabled": True, "queue_ttl_s": 0.5, "saturation_gate": False},
    )
    first: list[Any] = []
    holder = threading.Thread(target=post, args=(handle.url, 150, {}, first, 30.0))
    holder.start()
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 1)
    late: list[Any] = []
    started = time.monotonic()
    post(handle.url, 5, {}, late, 10.0)
    waited = time.monotonic() - started
    status, headers, content = late[0]
    error = json.loads(content)["error"]
    assert status == 503 and headers["retry-after"] == "3" and 0.5 <= waited < 2.5
    assert "(queue_ttl)" in error["message"] and "flow.queue_ttl_s" in error["message"]
    holder.join(timeout=20)
    assert first[0][0] == 200
    logged = [r for r in handle.logged_requests() if r.get("outcome") == "shed"]
    assert len(logged) == 1 and "queue_ttl" in logged[0]["error"]


def test_a_queued_request_is_served_when_a_slot_frees_highest_band_first(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(
        pair,
        admission={"max_requests_in_flight": 1},
        flow={"enabled": True, "queue_ttl_s": 30.0, "saturation_gate": False},
    )
    url = handle.url
    first: list[Any] = []
    holder = threading.Thread(target=post, args=(url, 40, {}, first, 30.0))
    holder.start()
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 1)
    done: list[tuple[str, float]] = []

    def timed(name: str, priority: str) -> None:
        out: list[Any] = []
        post(url, 5, {"x-narwhal-priority": priority}, out, 30.0)
        assert out[0][0] == 200, out
        done.append((name, time.monotonic()))

    low = threading.Thread(target=timed, args=("low", "0"))
    low.start()
    handle.wait_for(lambda: queued(handle, "0") == 1)
    high = threading.Thread(target=timed, args=("high", "5"))
    high.start()
    handle.wait_for(lambda: queued(handle, "5") == 1)
    for thread in (holder, low, high):
        thread.join(timeout=20)
    assert first[0][0] == 200
    assert [name for name, _ in sorted(done, key=lambda d: d[1])] == ["high", "low"]
    bad = httpx.post(
        url + "/v1/completions",
        json={"model": MODEL, "prompt": "x"},
        headers={"x-narwhal-priority": "urgent"},
        timeout=5,
    )
    assert bad.status_code == 400 and "x-narwhal-priority" in bad.json()["error"]["message"]
