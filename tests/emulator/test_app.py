"""An emulated engine over loopback HTTP: its fault API speaks the shared vocabulary, and the
faults both worlds share act as the simulated engine acts them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from narwhal.cli import main
from narwhal.core.sse import EventKind, SseEvent, SseParser
from narwhal.emulator.text import completion_tokens, prompt_text
from tests.live.conftest import HTTP, Emulator

PROMPT = "The narwhal's tusk is a tooth"


def expected(n: int) -> list[str]:
    return completion_tokens(prompt_text({"prompt": PROMPT}, chat=False), n)


def stream_events(url: str, max_tokens: int, client: httpx.Client = HTTP) -> list[SseEvent]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    reply = client.post(url + "/v1/completions", json=body)
    assert reply.status_code == 200
    parser = SseParser()
    return [*parser.feed(reply.content), *parser.close()]


def tokens_of(events: list[SseEvent]) -> list[str]:
    return [
        e.payload["choices"][0]["text"] for e in events if e.kind is EventKind.TOKEN and e.payload
    ]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"condition not met within {timeout} s"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "done_first"}, "'done_first' is now called 'early_done'"),
        ({"kind": "status", "code": 503}, "'status' is now called 'http_5xx'"),
        ({"kind": "stall", "after": 2}, "'after' is now called 'after_tokens'"),
        ({"kind": "crash"}, "acted out by the simulator only"),
    ],
)
def test_the_admin_api_refuses_what_it_cannot_use_and_applies_nothing(
    emulator: Callable[..., Emulator], fault: dict[str, Any], message: str
) -> None:
    engine = emulator("both")
    reply = HTTP.post(engine.url + "/admin/faults", json={"faults": [{"kind": "reset"}, fault]})
    assert reply.status_code == 400
    assert message in reply.json()["error"]["message"]
    assert engine.state()["faults"] == []


def test_early_done_sends_done_after_its_tokens(emulator: Callable[..., Emulator]) -> None:
    engine = emulator("both")
    engine.faults({"kind": "early_done", "after_tokens": 2})
    events = stream_events(engine.url, 5)
    assert tokens_of(events) == expected(2)
    assert events[-1].kind is EventKind.DONE
    assert all(e.payload["choices"][0]["finish_reason"] is None for e in events if e.payload)
    whole = HTTP.post(engine.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 5})
    assert whole.json()["choices"][0]["text"] == "".join(expected(2))


def test_a_hung_engine_answers_health_and_opens_streams_but_generates_nothing(
    emulator: Callable[..., Emulator],
) -> None:
    engine = emulator("both")
    engine.faults({"kind": "hang"})
    assert HTTP.get(engine.url + "/health").status_code == 200
    opened = threading.Event()
    received: list[bytes] = []

    def read() -> None:
        body = {"prompt": PROMPT, "max_tokens": 3, "stream": True}
        url = engine.url + "/v1/completions"
        with httpx.Client(timeout=10) as client, client.stream("POST", url, json=body) as reply:
            assert reply.status_code == 200
            opened.set()
            received.extend(reply.iter_raw())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(5)  # HTTP 200 and the SSE headers came while hung
    state = engine.state()
    assert state["hung"] and state["running"] == 1 and state["generation_tokens"] == 0
    assert received == []
    engine.clear()  # the hang ends: the stream runs on
    reader.join(5)
    assert not reader.is_alive()
    parser = SseParser()
    events = [*parser.feed(b"".join(received)), *parser.close()]
    assert tokens_of(events) == expected(3) and events[-1].kind is EventKind.DONE
    wait_until(lambda: engine.state()["completed"] == 1)


def test_emulate_refuses_an_old_fault_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emulate", "--port", "0", "--fault", "close:after=1"]) == 2
    assert "'close' is now called 'disconnect'" in capsys.readouterr().err


def test_a_fault_with_a_probability_strikes_that_share_of_requests_as_seeded(
    emulator: Callable[..., Emulator],
) -> None:
    def statuses(engine: Emulator) -> list[int]:
        body = {"prompt": PROMPT, "max_tokens": 1}
        return [
            HTTP.post(engine.url + "/v1/completions", json=body).status_code for _ in range(150)
        ]

    fault = {"kind": "http_5xx", "code": 503, "probability": 0.2}
    first, twin, other = (emulator("both", seed=seed) for seed in (5, 5, 6))
    for engine in (first, twin, other):
        engine.faults(fault)
    assert first.state()["faults"] == [{**fault, "count": None, "phase": "any"}]
    drawn = statuses(first)
    assert set(drawn) == {200, 503}
    assert 15 <= drawn.count(503) <= 45  # 20% of 150, binomial sd about 5
    assert statuses(twin) == drawn  # the same seed strikes the same requests
    assert statuses(other) != drawn
