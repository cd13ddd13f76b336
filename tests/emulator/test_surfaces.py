"""The emulator's /metrics read back by the router's own parser: the load gauges under vLLM's
names carry the engine's true running requests and KV usage (requests served, handoffs held)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from narwhal.core.routing.load import EngineLoad
from narwhal.core.routing.vllm_metrics import engine_load
from narwhal.emulator.timing import LinearTiming
from tests.emulator.test_app import wait_until
from tests.live.conftest import HTTP, Emulator

PROMPT = "The narwhal's tusk is a tooth"
BLOCKS = 100  # kv_cache_tokens = 1600 in blocks of 16


def load(engine: Emulator) -> EngineLoad:
    return engine_load(HTTP.get(engine.url + "/metrics").content, "tiny-llama")


def prompt_tokens(engine: Emulator) -> int:
    reply = HTTP.post(engine.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
    tokens: int = reply.json()["usage"]["prompt_tokens"]
    return tokens


def test_an_idle_engine_reports_no_load(emulator: Callable[..., Emulator]) -> None:
    assert load(emulator("both")) == EngineLoad(0.0, 0.0, 0.0)


def test_a_request_being_served_is_running_and_holds_its_blocks(
    emulator: Callable[..., Emulator],
) -> None:
    engine = emulator("decode", timing=LinearTiming(decode_s_per_token=0.05), kv_cache_tokens=1600)
    prompt = prompt_tokens(engine)
    assert load(engine) == EngineLoad(0.0, 0.0, 0.0)  # that request is done
    body = {"prompt": PROMPT, "max_tokens": 12, "stream": True}
    streaming = threading.Thread(
        target=HTTP.post, args=(engine.url + "/v1/completions",), kwargs={"json": body}
    )
    streaming.start()
    try:
        wait_until(lambda: load(engine).num_requests_running == 1)
        held = load(engine)
        assert held.num_requests_waiting == 0.0
        assert held.kv_cache_usage_perc == math.ceil((prompt + 12) / 16) / BLOCKS
    finally:
        streaming.join(timeout=10)
    assert load(engine) == EngineLoad(0.0, 0.0, 0.0)


def test_a_producers_handoff_holds_its_blocks_until_released(
    emulator: Callable[..., Emulator],
) -> None:
    producer = emulator("prefill", kv_cache_tokens=1600)
    prompt = prompt_tokens(producer)
    leg = {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    params = HTTP.post(producer.url + "/v1/completions", json=leg).json()["kv_transfer_params"]
    assert load(producer) == EngineLoad(0.0, 0.0, math.ceil(prompt / 16) / BLOCKS)
    HTTP.post(producer.url + "/kv/release", json={"kv_transfer_params": params}).raise_for_status()
    assert load(producer).kv_cache_usage_perc == 0.0
