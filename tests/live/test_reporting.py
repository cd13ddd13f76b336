"""What the router reports per request: the ``model`` label stays in a bounded set, the
request's log line carries it, and the log on stdout writes each line whole."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest

from narwhal.live.reporting import MAX_MODEL_LABELS, ModelLabels, StdoutRequestLog
from tests.live.conftest import HTTP, Emulator, RouterHandle, metric_value

CONTRACT = {"model": "tiny-llama", "vllm_version": "0.32.0"}


def test_a_pinned_model_is_the_only_label_besides_other() -> None:
    labels = ModelLabels("tiny-llama")
    labels.learn(["something-else"])  # the contract decides, not what engines list
    assert labels.label("tiny-llama") == "tiny-llama"
    assert labels.label(None) == "tiny-llama"  # served by the one model every engine has
    assert labels.label("something-else") == "other"
    assert labels.label(["not", "a", "string"]) == "other"


def test_listed_models_are_learned_up_to_the_bound() -> None:
    labels = ModelLabels(None)
    assert labels.label("m-0") == "other"
    labels.learn(f"m-{i}" for i in range(MAX_MODEL_LABELS + 10))
    assert labels.label("m-0") == "m-0"
    assert labels.label(f"m-{MAX_MODEL_LABELS}") == "other"
    assert labels.label(None) == "other"
    assert len(labels.known) == MAX_MODEL_LABELS


class CountingRaw(io.RawIOBase):
    """A raw stream that keeps what each write handed the kernel's side of it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.writes.append(bytes(data))
        return len(data)


def test_each_request_line_is_one_write_of_the_whole_line() -> None:
    raw = CountingRaw()
    log = StdoutRequestLog(io.BufferedWriter(raw, buffer_size=64))
    lines = [b'{"n":1}\n', b'{"n":"' + b"x" * 200 + b'"}\n', b'{"n":3}\n']
    for line in lines:
        log(line)
    assert raw.writes == lines  # not split (a line longer than the buffer too), not batched


def test_a_broken_stdout_is_reported_once_and_ends_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads: the write fails with a broken pipe
    stream = os.fdopen(write_end, "wb")
    log = StdoutRequestLog(stream)
    with caplog.at_level(logging.ERROR, logger="narwhal.live"):
        log(b'{"n":1}\n')  # no exception: serving goes on
        log(b'{"n":2}\n')
    assert log.failed
    assert [r.getMessage() for r in caplog.records if "request log" in r.getMessage()] == [
        "the request log's stdout failed ([Errno 32] Broken pipe): no more request lines"
    ]
    with pytest.raises(OSError):
        stream.close()  # what is still buffered cannot be written either


def pair(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], **options: Any
) -> RouterHandle:
    producer, consumer = emulator("prefill"), emulator("decode")
    engines = [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
    ]
    return router(engines, **options)


def ask(handle: RouterHandle, model: str) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    return HTTP.post(handle.url + "/v1/completions", json=body).status_code


def test_requests_are_counted_by_the_model_they_asked_for(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
) -> None:
    handle = pair(emulator, router, contract=CONTRACT)
    assert ask(handle, "tiny-llama") == 200
    assert ask(handle, "made-up-model") == 404  # the router answers for the pinned contract
    metrics = handle.metrics()
    ok = {"outcome": "ok", "status": "200"}
    assert metric_value(metrics, "narwhal_requests_total", model="tiny-llama", **ok) == 1
    assert metric_value(metrics, "narwhal_requests_total", model="other", status="404") == 1
    assert metric_value(metrics, "narwhal_generation_tokens_total", model="tiny-llama") == 2
    for histogram in ("e2e_request_latency", "time_to_first_token", "time_to_prefill"):
        name = f"narwhal_{histogram}_seconds_count"
        assert metric_value(metrics, name, model="tiny-llama") == 1
    lines = handle.logged_requests()
    assert [line["model"] for line in lines] == ["tiny-llama", "other"]


def test_without_a_contract_the_models_the_engines_list_are_labels(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    handle = pair(emulator, router)
    assert ask(handle, "tiny-llama") == 200  # not yet known: no engine was asked
    assert HTTP.get(handle.url + "/v1/models").status_code == 200
    assert ask(handle, "tiny-llama") == 200
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", model="other", outcome="ok") == 1
    assert metric_value(metrics, "narwhal_requests_total", model="tiny-llama", outcome="ok") == 1


def test_prompt_tokens_are_counted_as_the_engines_report_them(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
) -> None:
    handle = pair(emulator, router, contract=CONTRACT)
    consumer = next(e["url"] for e in handle.status()["engines"] if e["role"] == "decode")
    prompt = "count these few words please"
    direct = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 1}
    engine_says = HTTP.post(consumer + "/v1/completions", json=direct).json()
    reported = engine_says["usage"]["prompt_tokens"]
    assert reported > 1
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 2}
    assert HTTP.post(handle.url + "/v1/completions", json=body).status_code == 200  # P/D
    streamed = HTTP.post(handle.url + "/v1/completions", json={**body, "stream": True})
    assert streamed.status_code == 200
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_prompt_tokens_total", model="tiny-llama") == 2 * reported
    lines = handle.logged_requests()
    assert [line["prompt_tokens"] for line in lines] == [reported, reported]
