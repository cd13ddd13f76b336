"""The bound on a non-streaming answer being assembled, against an emulated engine: past
``engine.max_response_bytes`` the client gets a 502, the engine is charged, its stream is closed
and nothing stays reserved; a streamed request of the same size is served whole."""

from __future__ import annotations

from collections.abc import Callable

from tests.live.conftest import HTTP, Emulator, RouterHandle

BOUND = 1024  # the smallest the configuration takes; 64 tokens of the emulator come to ~10 KB


def test_an_answer_past_the_bound_is_a_502_charged_to_the_engine(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    engine = emulator("both")
    handle = router([{"url": engine.url, "role": "both"}], engine={"max_response_bytes": BOUND})
    small = HTTP.post(handle.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert small.status_code == 200 and small.json()["usage"]["completion_tokens"] == 2

    big = {"prompt": "hi", "max_tokens": 64}
    reply = HTTP.post(handle.url + "/v1/completions", json=big)
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert error["type"] == "engine_malformed_response"
    assert f"engine.max_response_bytes ({BOUND} bytes)" in error["message"]
    status = handle.engine(engine.url)
    assert status["failure_streak"] == 1
    assert status["reservations"] == {"prefill": 0, "decode": 0}
    handle.wait_for(lambda: engine.state()["running"] == 0)  # its stream was closed

    streamed = HTTP.post(handle.url + "/v1/completions", json={**big, "stream": True})
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
