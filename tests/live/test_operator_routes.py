"""What an operator coming from vllm-router expects of the router, over real HTTP on loopback
against emulated engines: a model the pinned contract does not serve is refused by the router
(vLLM's 404) without asking any engine, and ``/tokenize`` / ``/detokenize`` are answered by a
ready engine, its failures a 502 or 504 that charge nobody."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from narwhal.emulator.text import BOS_ID, SPECIAL_TOKENS, prompt_tokens
from tests.live.conftest import HTTP, Emulator, RouterHandle, metric_value

CONTRACT = {"model": "tiny-llama", "vllm_version": "0.32.0"}
NOT_FOUND = {
    "error": {
        "message": "The model `gpt-4o` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
}


def pair(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], **options: Any
) -> tuple[Emulator, Emulator, RouterHandle]:
    producer, consumer = emulator("prefill"), emulator("decode")
    engines = [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]
    return producer, consumer, router(engines, **options)


def test_a_model_the_contract_does_not_serve_gets_vllms_404_and_no_engine_is_asked(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, consumer, handle = pair(emulator, router, contract=CONTRACT)
    engine_says = HTTP.post(
        consumer.url + "/v1/completions", json={"model": "gpt-4o", "prompt": "hi"}
    )
    asked = consumer.state()["requests"]
    for path, body in (
        ("/v1/completions", {"model": "gpt-4o", "prompt": "hi", "max_tokens": 2}),
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user"}]}),
        ("/v1/completions", {"model": "gpt-4o", "prompt": "hi", "stream": True}),
    ):
        reply = HTTP.post(handle.url + path, json=body)
        assert reply.status_code == 404
        assert reply.json() == NOT_FOUND == engine_says.json()  # what vLLM would have said
        assert reply.headers["content-type"] == "application/json"
    assert producer.state()["requests"] == 0 and consumer.state()["requests"] == asked
    assert all(e["failure_streak"] == 0 for e in handle.status()["engines"])
    named = HTTP.post(handle.url + "/v1/completions", json={"model": "tiny-llama", "prompt": "hi"})
    unnamed = HTTP.post(handle.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert named.status_code == unnamed.status_code == 200  # no model: vLLM's default model
    assert producer.state()["requests"] == 2
    metrics = handle.metrics()
    refused = {"outcome": "model_not_found", "status": "404"}
    assert metric_value(metrics, "narwhal_requests_total", model="other", **refused) == 3
    logged = [line for line in handle.logged_requests() if line["status"] == 404]
    assert [(line["attempts"], line["engines"]) for line in logged] == [(0, [])] * 3


def test_without_a_contract_the_engines_answer_for_their_models(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, _, handle = pair(emulator, router)
    body = {"model": "gpt-4o", "prompt": "hi", "max_tokens": 2}
    reply = HTTP.post(handle.url + "/v1/completions", json=body)
    assert reply.status_code == 404 and reply.json() == NOT_FOUND
    assert producer.state()["requests"] == 1  # the router does not know; the engine said it


def test_tokenize_and_detokenize_are_answered_by_a_ready_engine(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, consumer, handle = pair(emulator, router, contract=CONTRACT)
    prompt = "Hello, router"
    direct = HTTP.post(producer.url + "/tokenize", json={"prompt": prompt}).json()
    answers = [
        HTTP.post(handle.url + "/tokenize", json={"model": "tiny-llama", "prompt": prompt})
        for _ in range(2)
    ]
    for answer in answers:
        assert answer.status_code == 200
        assert answer.json() == direct
    tokens = direct["tokens"]
    assert direct["count"] == len(tokens) == prompt_tokens(prompt) and tokens[0] == BOS_ID
    assert direct["max_model_len"] == 2048
    back = HTTP.post(handle.url + "/detokenize", json={"tokens": tokens})
    assert back.status_code == 200 and back.json() == {"prompt": SPECIAL_TOKENS[BOS_ID] + prompt}
    chat = {"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": False}
    assert HTTP.post(handle.url + "/tokenize", json=chat).json()["count"] > len("hi")
    # the engine's own 400 for a bad body is passed through as it said it
    bad = HTTP.post(handle.url + "/detokenize", json={"tokens": ["x"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    # a model the contract does not serve: the router's 404, as for inference
    refused = HTTP.post(handle.url + "/tokenize", json={"model": "gpt-4o", "prompt": "x"})
    assert refused.status_code == 404 and refused.json() == NOT_FOUND
    # tokenizing is no inference: neither engine counted a request
    assert producer.state()["requests"] == consumer.state()["requests"] == 0


def test_passthrough_bounds_and_refusals_are_the_routers_own(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    _, _, handle = pair(emulator, router, max_body_bytes=1024, api_key="k")
    auth = {"authorization": "Bearer k"}
    assert HTTP.post(handle.url + "/tokenize", json={"prompt": "x"}).status_code == 401
    big = HTTP.post(handle.url + "/tokenize", json={"prompt": "x" * 2000}, headers=auth)
    assert big.status_code == 413
    assert "admission.max_body_bytes" in big.json()["error"]["message"]
    plain = HTTP.post(handle.url + "/tokenize", content=b'{"prompt": "x"}', headers=auth)
    assert plain.status_code == 415
    json_type = {**auth, "content-type": "application/json"}
    for raw in (b"{", b"[1]"):
        reply = HTTP.post(handle.url + "/tokenize", content=raw, headers=json_type)
        assert reply.status_code == 400
    assert HTTP.get(handle.url + "/tokenize").status_code == 405
    ok = HTTP.post(handle.url + "/tokenize", json={"prompt": "x"}, headers=auth)
    assert ok.status_code == 200 and ok.json()["count"] == 2


def test_an_engine_failing_a_passthrough_is_a_gateway_error_that_charges_nobody(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    engine = emulator("both")
    # health checks and probes far apart: the engine stays "ready" in the router's eyes
    handle = router(
        [{"url": engine.url, "role": "both"}],
        engine={"first_token_timeout_s": 0.3},
        recovery={"probe_interval_s": 60.0, "eject_after": 1},
    )
    # one answer first: the router's first health check (at its start) is over by then
    assert HTTP.post(handle.url + "/tokenize", json={"prompt": "x"}).status_code == 200
    engine.faults({"kind": "freeze", "seconds": 1.0})
    hung = HTTP.post(handle.url + "/tokenize", json={"prompt": "x"})
    assert hung.status_code == 504
    assert "engine.first_token_timeout_s" in hung.json()["error"]["message"]
    engine.server.stop()  # refused from now on
    gone = HTTP.post(handle.url + "/detokenize", json={"tokens": [1]})
    assert gone.status_code == 502 and gone.json()["error"]["type"] == "engine_unreachable"
    (state,) = handle.status()["engines"]
    assert state["state"] == "ready" and state["failure_streak"] == 0  # eject_after = 1
    assert metric_value(handle.metrics(), "narwhal_requests_total") == 0  # not inference


def test_passthrough_with_no_ready_engine_is_a_503_with_retry_after(
    router: Callable[..., RouterHandle],
) -> None:
    dead = "http://127.0.0.1:9"  # discard: nothing listens
    handle = router([{"url": dead, "role": "both"}], recovery={"probe_interval_s": 0.05})
    handle.wait_for(lambda: handle.engine(dead)["state"] != "ready")
    reply = HTTP.post(handle.url + "/tokenize", json={"prompt": "x"})
    assert reply.status_code == 503 and int(reply.headers["retry-after"]) >= 1
    assert isinstance(reply.json()["error"]["message"], str)


def test_the_emulator_tokenizer_refuses_what_vllm_refuses(
    emulator: Callable[..., Emulator],
) -> None:
    engine = emulator("both")
    post = httpx.Client(base_url=engine.url, timeout=10).post
    assert post("/tokenize", json={"prompt": 5}).status_code == 400
    assert post("/tokenize", json={"model": "gpt-4o", "prompt": "x"}).json() == {
        "error": {**NOT_FOUND["error"], "message": "The model `gpt-4o` does not exist."}
    }
    assert post("/detokenize", json={"tokens": [-1]}).status_code == 400
    assert post("/detokenize", json={"tokens": [1, 6 + ord("a")]}).json() == {"prompt": "<s>a"}
