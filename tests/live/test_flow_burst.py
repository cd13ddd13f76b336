"""Flow control's bounds under a burst of 5,000 requests over real HTTP (the issue's number), the
real router in front of emulators: the band's queue never holds more than its bound, every
request beyond it gets 503 + Retry-After naming ``queue_full`` at once, ``/health`` answers
within a bound while the burst is in flight, nothing hangs (every request is answered, the
queued ones served once the slot frees), and the router's memory stays bounded.

The burst is 5,000 raw asyncio connections opened from the test, each sending one request and
reading its whole answer. The router's ``client.max_connections`` (default 4,096) is raised to
6,000 here so that every connection of the burst is served rather than closed at accept (that
bound is tested in test_edge_timeouts); the router raises its descriptor limit to fit it, and the
test needs room for both ends of every connection in its one process.
"""

from __future__ import annotations

import asyncio
import json
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from narwhal.core.flow import REASONS
from narwhal.emulator.timing import LinearTiming
from tests.live.conftest import Emulator, RouterHandle, metric_value
from tests.live.test_flow_live import MODEL

BURST = 5_000
BOUND = 50  # flow.max_queue_per_band
CONNECTING = 200  # connections being opened at once (the listen backlog is 256)
# /health answers within this while the burst is in flight: the router, the burst's 5,000
# clients and their event loop share this one process (and two cores on CI); it took 1.2 s at
# worst here, against the 120 s the queued requests may wait
HEALTH_BOUND_S = 5.0


async def exchange(host: str, port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request on a fresh connection (asking to close it after) and read the answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def completion(priority: int) -> bytes:
    body = json.dumps({"model": MODEL, "prompt": "burst", "max_tokens": 2}).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"x-narwhal-priority: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
        % (priority, len(body), body)
    )


GET = b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


def hold(url: str, leave: threading.Event, out: list[Any]) -> None:
    """A stream of 3,000 tokens (30 s) whose client reads it until ``leave``, then hangs up."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 3_000, "stream": True}
    with (
        httpx.Client(timeout=60.0) as client,
        client.stream("POST", url + "/v1/completions", json=body) as reply,
    ):
        out.append(reply.status_code)
        for _ in reply.iter_bytes():
            if leave.is_set():
                break


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


async def burst(
    host: str, port: int, answered_refusals: asyncio.Event
) -> tuple[list[Any], list[float], list[int]]:
    """The burst's answers, /health's latencies and the queue lengths sampled meanwhile."""
    connecting = asyncio.Semaphore(CONNECTING)
    refusals = 0

    async def one() -> Any:
        nonlocal refusals
        async with connecting:
            reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(completion(-1))
            data = await asyncio.wait_for(reader.read(), timeout=60)
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status == 503:
            refusals += 1
            if refusals == BURST - BOUND:
                answered_refusals.set()
        return status, dict(line.lower().split(": ", 1) for line in lines[1:]), body

    health: list[float] = []
    lengths: list[int] = []
    tasks = [asyncio.create_task(one()) for _ in range(BURST)]
    while sum(1 for task in tasks if task.done()) < BURST - BOUND:
        started = time.monotonic()
        status, _, _ = await asyncio.wait_for(exchange(host, port, GET % b"/health"), 10)
        health.append(time.monotonic() - started)
        assert status == 200
        _, _, body = await asyncio.wait_for(exchange(host, port, GET % b"/status"), 10)
        flow = json.loads(body)["flow"]
        lengths.append(flow["-1"]["queue_length"] if "-1" in flow else 0)
        if any(task.done() and task.exception() for task in tasks):
            break
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    return answers, health, lengths


def test_queue_bound_and_health_hold_under_a_burst_of_5000(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * BURST + 1_000  # both ends of every connection live in this process
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the descriptor hard limit {hard} is below {needed}")
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    producer = emulator("prefill")
    consumer = emulator("decode", timing=LinearTiming(decode_s_per_token=0.01))
    engines = [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]
    handle = router(
        engines,
        engine={"request_timeout_s": 120.0},
        admission={"max_requests_in_flight": 1, "retry_after_s": 2},
        client={"max_connections": 6_000},
        flow={
            "enabled": True,
            "max_queue_per_band": BOUND,
            "queue_ttl_s": 120.0,
            "saturation_gate": False,
        },
    )
    host, port = handle.url.removeprefix("http://").split(":")
    first: list[Any] = []  # holds the one slot until the burst's refusals are all answered
    leave = threading.Event()
    holder = threading.Thread(target=hold, args=(handle.url, leave, first))
    holder.start()
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 1)
    rss_before = rss_kib()

    async def run() -> tuple[list[Any], list[float], list[int]]:
        answered_refusals = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def release() -> None:  # the holder's client leaves once every refusal is in
            await answered_refusals.wait()
            await loop.run_in_executor(None, leave.set)

        releaser = asyncio.create_task(release())
        try:
            return await asyncio.wait_for(burst(host, int(port), answered_refusals), 90)
        finally:
            releaser.cancel()

    started = time.monotonic()
    try:
        answers, health, lengths = asyncio.run(run())
    finally:
        leave.set()
        holder.join(timeout=30)
    took = time.monotonic() - started
    rss_growth_mib = (rss_kib() - rss_before) / 1024

    errors = [answer for answer in answers if isinstance(answer, BaseException)]
    assert not errors, errors[:3]
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] * BOUND + [503] * (BURST - BOUND)
    for status, headers, body in answers:
        if status == 503:
            error = json.loads(body)["error"]
            assert headers["retry-after"] == "2" and error["type"] == "router_shed"
            assert "(queue_full)" in error["message"]
    assert first == [200]
    assert lengths and max(lengths) == BOUND, lengths  # it filled, and never overflowed
    assert health and max(health) < HEALTH_BOUND_S, max(health)
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 0)
    flow = handle.status()["flow"]["-1"]
    assert flow["queue_length"] == 0 and flow["dispatched"] == BOUND
    assert flow["refused"] == {**dict.fromkeys(REASONS, 0), "queue_full": BURST - BOUND}
    metrics = handle.metrics()
    shed = metric_value(metrics, "narwhal_requests_total", outcome="shed", status="503")
    assert shed == BURST - BOUND
    # the queue holds tickets, not bodies or engine work: 5,000 answered connections (both
    # ends in this process) leave the process well under this
    assert rss_growth_mib < 256, rss_growth_mib
    assert took < 60, took
