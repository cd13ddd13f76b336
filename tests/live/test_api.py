"""The router's HTTP surface: auth, body limits, malformed input, /v1/models, /health, /status,
/metrics, and the request log."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from narwhal.serving import BackgroundServer, bind, make_server, port_of
from tests.live.conftest import HTTP, Emulator, RouterHandle, Servers, metric_value


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
    logged += [line.decode() for line in handle.request_lines]
    assert any('"event":"request"' in line for line in logged)  # the request log was captured
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

    assert (
        HTTP.post(url, content=chunks(), headers={"content-type": "application/json"}).status_code
        == 413
    )
    assert handle.status()["requests_in_flight"] == 0


def test_json_nested_past_any_recursion_limit_is_a_400(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(pair)
    deep = b'{"prompt": "x", "user": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    reply = HTTP.post(
        handle.url + "/v1/completions", content=deep, headers={"content-type": "application/json"}
    )
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
            "load",
            "load_problem",
        }
        assert engine["state"] == "ready"
        assert engine["reservations"] == {"prefill": 0, "decode": 0}
        assert engine["load"] is None and engine["load_problem"] is None  # nothing scraped
    assert status["prefills"] == {
        "remote": 0,
        "short_prompt": 0,
        "no_producer": 0,
        "producer_failed": 0,
    }
    assert HTTP.get(handle.url + "/health").json()["status"] == "ok"
    models = HTTP.get(handle.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]
    handle.client().completions.create(model="tiny-llama", prompt="hello", max_tokens=2)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", outcome="ok", status="200") == 1
    assert metric_value(metrics, "narwhal_time_to_prefill_seconds_count") == 1
    assert metric_value(metrics, "narwhal_time_to_first_token_seconds_count") == 1
    assert metric_value(metrics, "narwhal_engine_state", engine=pair[1]["url"], state="ready") == 1
    assert metric_value(metrics, "narwhal_placements_total", phase="decode") == 1
    assert "narwhal_reservations_in_flight" in metrics


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-1e400"])
def test_a_number_json_cannot_carry_is_a_400(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]], number: bytes
) -> None:
    handle = router(pair)
    body = b'{"prompt": "hi", "max_tokens": 2, "temperature": ' + number + b"}"
    reply = HTTP.post(
        handle.url + "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == 400  # it was a 500: the prefill body could not be encoded
    assert reply.json()["error"]["message"].startswith("'temperature' must be a finite number")
    assert handle.status()["requests_in_flight"] == 0


def test_unknown_paths_and_methods_get_openai_shaped_errors(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(pair)
    missing = HTTP.get(handle.url + "/v1/embeddings")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "Not Found: GET /v1/embeddings",
        "type": "not_found_error",
        "param": None,
        "code": 404,
    }
    wrong = HTTP.get(handle.url + "/v1/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["type"] == "invalid_request_error"


async def odd_engine(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers /version and /v1/models with JSON of unexpected shapes."""
    if scope["type"] != "http":
        return
    body = {"/version": b'{"version": 7}', "/v1/models": b'{"object": "list", "data": null}'}
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body.get(scope["path"], b"[]")})


def test_the_router_starts_whatever_shape_an_engine_lists_its_models_in(
    servers: Servers, router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> None:
    sock = bind("127.0.0.1", 0)
    servers.start(BackgroundServer(make_server(odd_engine, lifespan="off"), [sock]))
    odd = f"http://127.0.0.1:{port_of(sock)}"
    lines: list[str] = []
    router(
        [{"url": odd, "role": "prefill"}, {"url": emulator("decode").url, "role": "decode"}],
        announce=lines.append,
    )
    assert len(lines) == 2 and "vllm 7  models ?" in lines[0]  # it crashed on "data": null


def test_a_request_over_the_engines_context_is_clamped_and_blocks_nothing(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    # vLLM clamps prompt + max_tokens to its context, and so must the emulator: building all
    # 10**20 tokens would take minutes, and refusing the request is not what vLLM does
    handle = router(pair)
    url = handle.url + "/v1/completions"
    prompt = "p" * 2040  # 2,041 tokens of a 2,048 context: room for 7
    reply = HTTP.post(url, json={"prompt": prompt, "max_tokens": 10**20}, timeout=10)
    assert reply.status_code == 200
    choice = reply.json()["choices"][0]
    assert len(choice["text"]) == 7 and choice["finish_reason"] == "length"
    too_long = HTTP.post(url, json={"prompt": "p" * 2048, "max_tokens": 1})
    assert too_long.status_code == 400  # no room at all: the engine's 400, passed through
    assert "longer than the maximum model length of 2048" in too_long.json()["error"]["message"]
    assert all(e["failure_streak"] == 0 for e in handle.status()["engines"])  # not charged


def test_the_prefill_leg_drops_what_a_one_token_non_streamed_request_cannot_carry(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    # the emulator refuses these as vLLM does: they reach only the streamed decode leg
    handle = router(pair)
    body = {"prompt": "hi", "max_tokens": 4, "min_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    reply = HTTP.post(handle.url + "/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    direct = HTTP.post(pair[0]["url"] + "/v1/completions", json={**body, "stream": False})
    assert direct.status_code == 400  # what the producer says if they were forwarded


def test_livez_stays_up_while_health_reports_an_outage(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> None:
    """Readiness follows the engines, liveness only the process: an orchestrator probing
    ``/livez`` does not restart the router (and lose its breaker state) during an outage."""
    closed = bind("127.0.0.1", 0)
    dead_url = f"http://127.0.0.1:{port_of(closed)}"
    closed.close()  # nothing listens there: every health check is refused
    consumer = emulator("decode")
    handle = router(
        [{"url": dead_url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        recovery={"eject_after": 1},
    )
    assert HTTP.get(handle.url + "/livez").json() == {"status": "alive"}
    deadline = time.monotonic() + 30  # a bound, not a timing: the suite's busiest stage passed 10
    while HTTP.get(handle.url + "/health").status_code != 503:
        assert time.monotonic() < deadline, "the refused producer was never ejected"
        time.sleep(0.02)
    reply = HTTP.get(handle.url + "/livez")
    assert (reply.status_code, reply.json()) == (200, {"status": "alive"})


def test_a_clients_request_id_is_used_echoed_and_logged(
    router: Callable[..., RouterHandle],
    pair: list[dict[str, Any]],
) -> None:
    handle = router(pair)
    url = handle.url + "/v1/completions"
    body = {"prompt": "hi", "max_tokens": 2}
    reply = HTTP.post(url, json=body, headers={"x-request-id": "trace-7f3a.1"})
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-7f3a.1"
    assert [line["request_id"] for line in handle.logged_requests()] == ["trace-7f3a.1"]
    placed = [d.as_dict() for d in handle.router.policies.log.entries if d.kind == "place"]
    assert {d["request"] for d in placed} == {"trace-7f3a.1"}  # both legs, under the client's id
    fresh = set()
    for header in ({}, {"x-request-id": "has space"}, {"x-request-id": "x" * 129}):
        reply = HTTP.post(url, json=body, headers=header)
        assert reply.status_code == 200
        assert re.fullmatch(r"req-[0-9a-f]{32}", reply.headers["x-request-id"])
        fresh.add(reply.headers["x-request-id"])
    assert len(fresh) == 3  # random, not a counter that restarts with the process


def test_no_redirect_echoes_the_host_header(
    router: Callable[..., RouterHandle], pair: list[dict[str, Any]]
) -> None:
    handle = router(pair)
    reply = HTTP.get(
        handle.url + "/status/", headers={"host": "evil.example"}, follow_redirects=False
    )
    assert reply.status_code == 404 and "location" not in reply.headers
