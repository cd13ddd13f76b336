"""The router's HTTP surface: auth, body limits, malformed input, /v1/models, /health, /status,
/metrics, and the request log."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.live.conftest import HTTP, Emulator, RouterHandle, metric_value


@pytest.fixture
def pair(
    emulator: Callable[..., Emulator],
) -> list[dict[str, Any]]:
    producer, consumer = emulator("prefill"), emulator("decode")
    return [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]


def test_api_key(
    router: Callable[..., RouterHandle],
    pair: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    handle = router(pair, api_key="s3cret")
    with pytest.raises(openai.AuthenticationError) as caught:
        handle.client(api_key="wrong").completions.create(
            model="tiny-llama", prompt="x", max_tokens=1
        )
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    client = handle.client(api_key="s3cret")
    assert client.completions.create(model="tiny-llama", prompt="x", max_tokens=2).choices
    assert [m.id for m in client.models.list()] == ["tiny-llama"]
    assert HTTP.get(handle.url + "/v1/models").status_code == 401
    assert HTTP.get(handle.url + "/health").status_code == 200  # operational endpoints open
    logged = [r.getMessage() for r in caplog.records]
    assert any('"event": "request"' in line for line in logged)  # the request log was captured
    assert not any("s3cret" in line or "wrong" in line for line in logged)  # no key, good or bad


def test_malformed_json_and_bad_requests(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(pair, max_body_bytes=1000)
    url = handle.url + "/v1/completions"
    reply = HTTP.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "malformed JSON" in reply.json()["error"]["message"]
    reply = HTTP.post(url, json={"max_tokens": 3})
    assert reply.status_code == 400 and "'prompt' is required" in reply.json()["error"]["message"]
    reply = HTTP.post(url, json={"prompt": "x" * 2000})
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == 413

    def chunks() -> Any:  # no content-length: the limit applies while reading
        for _ in range(5):
            yield b"x" * 400

    assert HTTP.post(url, content=chunks()).status_code == 413
    assert handle.status()["requests_in_flight"] == 0


def test_json_nested_past_any_recursion_limit_is_a_400(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(pair)
    deep = b'{"prompt": "x", "user": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    reply = HTTP.post(handle.url + "/v1/completions", content=deep)
    assert reply.status_code == 400  # json.loads raised RecursionError here: a 500
    assert "malformed JSON body: recursion limit exceeded" in reply.json()["error"]["message"]
    assert handle.status()["requests_in_flight"] == 0


def test_status_health_models_metrics(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(pair)
    status = handle.status()
    assert [e["url"] for e in status["engines"]] == [e["url"] for e in pair]
    for engine in status["engines"]:
        assert set(engine) == {
            "url",
            "role",
            "state",
            "failure_streak",
            "ejected_since",
            "quarantined_until",
            "reservations",
        }
        assert engine["state"] == "ready"
        assert engine["reservations"] == {"prefill": 0, "decode": 0}
    assert HTTP.get(handle.url + "/health").json()["status"] == "ok"
    models = HTTP.get(handle.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    handle.client().completions.create(model="tiny-llama", prompt="hello", max_tokens=2)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", outcome="ok", status="200") == 1
    assert metric_value(metrics, "narwhal_ttft_s_count") == 1
    assert metric_value(metrics, "narwhal_first_byte_s_count") == 1
    assert metric_value(metrics, "narwhal_engine_state", engine=pair[1]["url"], state="ready") == 1
    assert metric_value(metrics, "narwhal_placements_total", phase="decode") == 1
    assert "narwhal_reservations_in_flight" in metrics
