"""Blame over real HTTP: a client that does not read, and the router's own event-loop stalls,
are charged to no engine; the request deadline and ``client.write_timeout_s`` cut off a client
that does not read, releasing everything.

The slow client is a raw socket with a small receive window, so the router's writes to it block
(the router's own send buffer is kept small too: ``send_buffer``, else loopback buffers take
megabytes before a write waits). The engine is an emulator streaming at a steady pace, with
``eject_after = 1``, so one wrongly charged fault would eject it (the cut-off tests use an
unpaced one, so that the router blocks long before the deadline whatever the machine's speed).
A client pauses until the router's writes to it block (a bounded poll), then for three silence
timeouts: that pause, like the blocked loop, is the scenario itself; every wait for an outcome
is a bounded poll.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from narwhal.emulator.timing import LinearTiming
from narwhal.live.serving import RouterServer
from tests.live.conftest import FAST_ENGINE, Emulator, RouterHandle, metric_value

PACED = LinearTiming(decode_s_per_token=0.0005)  # a long stream at a steady pace
UNPACED = LinearTiming()  # as fast as the emulator goes: the router's writes block at once
SMALL_BUFFER = 8192
SILENCE_S = FAST_ENGINE["decode_read_timeout_s"]
# Tokens the engine has generated once the router's writes to a paused client surely block:
# about 100 KB of events fill the router's write buffer (its transport's high water, 64 KiB) and
# the small kernel buffers on both sides; an event is about 215 bytes.
BLOCKED_AFTER_TOKENS = 800


class SlowReader:
    """An HTTP/1.1 client with a small receive window that reads only when told to."""

    def __init__(self, router_url: str, body: dict[str, Any]) -> None:
        host, port = router_url.removeprefix("http://").split(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # set before connecting: the window the client advertises from the start
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER // 2)
        self.sock.connect((host, int(port)))
        payload = json.dumps(body).encode()
        self.sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: router\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload
        )
        self.received = b""

    def read_head(self, limit_s: float = 5.0) -> bytes:
        """Read until the response head is in (the router sends it with the first token)."""
        self.sock.settimeout(limit_s)
        while b"\r\n\r\n" not in self.received:
            data = self.sock.recv(1024)
            assert data, "the router closed before the response head"
            self.received += data
        return self.received.split(b"\r\n\r\n", 1)[0]

    def read_to_end(self, limit_s: float = 10.0) -> bytes:
        """Read everything up to the end of the chunked body (or the connection's close)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # read fast now
        end = time.monotonic() + limit_s
        while not self.received.endswith(b"\r\n0\r\n\r\n"):
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                break
            self.received += data
        return self.received

    def close(self) -> None:
        self.sock.close()


def fleet(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    timing: LinearTiming = PACED,
    **router_options: Any,
) -> tuple[Emulator, RouterHandle]:
    engine = emulator(role="both", timing=timing, max_model_len=100_000)
    handle = router(
        [{"url": engine.url, "role": "both"}],
        recovery={"eject_after": 1},
        send_buffer=SMALL_BUFFER,
        **router_options,
    )
    return engine, handle


def pause_while_the_router_is_blocked(handle: RouterHandle, engine: Emulator) -> None:
    """The paused client stays paused until the router's writes to it block (the engine has
    generated well past what the buffers take), then for three silence timeouts more."""
    handle.wait_for(lambda: engine.state()["generation_tokens"] >= BLOCKED_AFTER_TOKENS)
    time.sleep(3 * SILENCE_S)  # the scenario: blocked three times as long as silence allows


def decisions(handle: RouterHandle, kind: str) -> list[dict[str, Any]]:
    return [d.as_dict() for d in list(handle.router.policies.log.entries) if d.kind == kind]


def assert_engine_unblamed(handle: RouterHandle, engine: Emulator) -> None:
    state = handle.engine(engine.url)
    assert state["state"] == "ready" and state["failure_streak"] == 0, state
    assert decisions(handle, "eject") == []


def all_released(handle: RouterHandle, engine: Emulator) -> bool:
    status = handle.status()
    held = sum(sum(e["reservations"].values()) for e in status["engines"])
    return status["requests_in_flight"] == 0 and held == 0 and engine.state()["running"] == 0


def test_a_slow_reader_blocks_the_router_but_the_engine_stays_ready(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    engine, handle = fleet(emulator, router)
    client = SlowReader(handle.url, {"prompt": "hello", "max_tokens": 1200, "stream": True})
    try:
        assert b" 200 " in client.read_head()
        pause_while_the_router_is_blocked(handle, engine)
        body = client.read_to_end()
    finally:
        client.close()
    assert body.count(b'"text":') == 1200 and b"data: [DONE]" in body
    assert b'"error"' not in body
    blocked = decisions(handle, "client_blocked")
    assert blocked and max(d["blocked_s"] for d in blocked) > SILENCE_S  # the router waited
    assert_engine_unblamed(handle, engine)
    assert metric_value(handle.metrics(), "narwhal_client_blocked_writes_total") >= 1
    assert metric_value(handle.metrics(), "narwhal_requests_total", outcome="ok") == 1


def test_a_client_that_pauses_then_closes_charges_no_engine(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    engine, handle = fleet(emulator, router)
    client = SlowReader(handle.url, {"prompt": "hello", "max_tokens": 5000, "stream": True})
    try:
        client.read_head()
        pause_while_the_router_is_blocked(handle, engine)
    finally:
        client.close()  # then it goes away
    handle.wait_for(lambda: all_released(handle, engine))
    assert_engine_unblamed(handle, engine)
    assert decisions(handle, "client_blocked")  # the router did wait on it
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", outcome="client_gone") == 1


def test_a_non_reading_client_is_cut_off_at_the_request_deadline(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    deadline_s = 1.0
    engine, handle = fleet(
        emulator,
        router,
        UNPACED,
        engine={"request_timeout_s": deadline_s},
        client={"write_timeout_s": 30},
    )
    started = time.monotonic()
    # far more than the emulator can stream into the buffers before the deadline, so the engine
    # is still generating when the router closes the stream (max_model_len caps it at 100,000)
    client = SlowReader(handle.url, {"prompt": "hello", "max_tokens": 90_000, "stream": True})
    try:
        handle.wait_for(lambda: all_released(handle, engine), timeout=deadline_s + 4)
        released_after = time.monotonic() - started
    finally:
        client.close()
    assert released_after < deadline_s + 1.0  # at the deadline, not when the client reads
    cuts = decisions(handle, "client_cut")
    assert [c["reason"] for c in cuts] == ["request_deadline"]
    assert engine.state()["aborted"] == 1  # the engine stream was closed
    assert_engine_unblamed(handle, engine)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", outcome="deadline", status="504") == 1
    assert metric_value(metrics, "narwhal_client_cutoffs_total", reason="request_deadline") == 1


def test_a_client_blocked_past_the_write_timeout_is_cut_off_as_its_own_fault(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    write_timeout_s = 0.5
    engine, handle = fleet(
        emulator,
        router,
        UNPACED,
        engine={"request_timeout_s": 10.0},
        client={"write_timeout_s": write_timeout_s},
    )
    client = SlowReader(handle.url, {"prompt": "hello", "max_tokens": 20_000, "stream": True})
    try:
        client.read_head()
        handle.wait_for(lambda: all_released(handle, engine), timeout=5.0)
        body = client.read_to_end()  # what the router wrote before it gave up, then the close
    finally:
        client.close()
    assert not body.endswith(b"\r\n0\r\n\r\n")  # the response was cut, not completed
    cuts = decisions(handle, "client_cut")
    assert [c["reason"] for c in cuts] == ["write_timeout"]
    assert_engine_unblamed(handle, engine)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", outcome="client_too_slow") == 1
    assert metric_value(metrics, "narwhal_client_cutoffs_total", reason="write_timeout") == 1


def test_a_stall_of_the_routers_event_loop_ejects_no_engine(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    engine = emulator(role="both", timing=LinearTiming(decode_s_per_token=0.002))
    handle = router([{"url": engine.url, "role": "both"}], recovery={"eject_after": 1})
    served = handle.server.server
    assert isinstance(served, RouterServer)
    loop = served.loop  # the router's event loop
    assert loop is not None
    stream = handle.client().completions.create(
        model="tiny-llama", prompt="hello", max_tokens=400, stream=True
    )
    text = ""
    for index, chunk in enumerate(stream):
        if index == 20:  # mid-stream, with health checks going on: block the loop
            loop.call_soon_threadsafe(time.sleep, 3 * SILENCE_S)
        text += chunk.choices[0].text
    assert len(text) == 400
    assert_engine_unblamed(handle, engine)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_event_loop_stalls_total") >= 1
    assert metric_value(metrics, "narwhal_event_loop_stalled_seconds_total") >= 2 * SILENCE_S
