"""Shutting the router down: requests still running when the grace period ends get a clear
end — a 503 before the commit, one terminal SSE error event after it — not a cut connection."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from narwhal.core.shutdown import SHUTDOWN_MESSAGE
from tests.live.conftest import Emulator, RouterHandle

SLOW = {"first_token_timeout_s": 30.0, "decode_read_timeout_s": 30.0, "request_timeout_s": 60.0}


def in_background(url: str, body: dict[str, Any], got: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        with httpx.Client(timeout=20) as client, client.stream("POST", url, json=body) as reply:
            got["status"] = reply.status_code
            if reply.status_code != 200:
                got["body"] = reply.read()
                return
            got["events"] = []
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    got["events"].append(line[6:])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    end = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < end, "condition not met"
        time.sleep(0.02)


def pair_with(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], fault: dict[str, Any]
) -> RouterHandle:
    producer, consumer = emulator("prefill"), emulator("decode")
    consumer.faults(fault)
    engines = [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}]
    return router(engines, engine=SLOW)


def test_a_committed_stream_gets_a_terminal_event_when_the_grace_period_ends(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
) -> None:
    handle = pair_with(emulator, router, {"kind": "stall", "after_tokens": 1})
    got: dict[str, Any] = {}
    body = {"prompt": "hi", "max_tokens": 8, "stream": True}
    thread = in_background(handle.url + "/v1/completions", body, got)
    wait_until(lambda: len(got.get("events", [])) >= 1)  # committed: a token arrived
    handle.server.stop()  # graceful 0.2 s, then what still runs is cancelled
    thread.join(10)
    assert got["status"] == 200
    *tokens, last = got["events"]
    assert tokens and json.loads(last)["error"] == {
        "message": SHUTDOWN_MESSAGE,
        "type": "service_unavailable",
        "param": None,
        "code": 503,
    }
    # logged and counted as what the client got, not as a client disconnect
    (line,) = handle.logged_requests()
    assert (line["outcome"], line["status"], line["committed"]) == ("shutdown", 503, True)
    assert line["error"] == SHUTDOWN_MESSAGE


def test_a_request_before_its_commit_gets_a_503(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
) -> None:
    handle = pair_with(emulator, router, {"kind": "hang_first_token"})
    got: dict[str, Any] = {}
    thread = in_background(handle.url + "/v1/completions", {"prompt": "hi", "stream": True}, got)
    wait_until(lambda: handle.status()["requests_in_flight"] == 1)
    handle.server.stop()
    thread.join(10)
    assert got["status"] == 503
    assert json.loads(got["body"])["error"]["message"] == SHUTDOWN_MESSAGE
    (line,) = handle.logged_requests()
    assert (line["outcome"], line["status"], line["committed"]) == ("shutdown", 503, False)
    metrics = handle.router.metrics.render().decode()
    assert 'narwhal_requests_total{model="other",outcome="shutdown",status="503"} 1.0' in metrics
