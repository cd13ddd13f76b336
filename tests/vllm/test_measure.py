"""(default run, no vLLM) Timing engines over HTTP (``narwhal.vllm.measure``): against emulated
engines on loopback, and the stream reading on events built by hand."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from narwhal.core.sse import SseParser
from narwhal.emulator.timing import LinearTiming
from narwhal.vllm.measure import StreamMarks, steady_step_s, time_batch, time_handoff
from tests.live.conftest import Emulator, Servers, start_emulator

TIMING = LinearTiming(decode_s_per_token=0.002)


def events(wire: bytes) -> list:  # type: ignore[type-arg]
    return SseParser().feed(wire)


def test_steady_window() -> None:
    # stream a: a token every 10 ms from t=0; stream b joins at 0.1 s: steps slow to 20 ms
    a = [(i * 0.01, i + 1) for i in range(10)] + [(0.09 + j * 0.02, 11 + j) for j in range(1, 20)]
    b = [(0.1 + j * 0.02, 1 + j) for j in range(20)]
    assert steady_step_s([a, b]) == pytest.approx(0.02)
    assert steady_step_s([a[:10]]) == pytest.approx(0.01)
    with pytest.raises(RuntimeError, match="no stream generated any text"):
        steady_step_s([[], []])


def test_stream_marks_count_tokens_from_usage_and_refuse_errors() -> None:
    seen = StreamMarks("http://e")
    seen.take(events(b'data: {"choices":[{"text":"a"}]}\n\n'), 1.0)
    # a burst: one chunk carrying three tokens, as continuous usage stats say
    burst = b'data: {"choices":[{"text":"bcd"}],"usage":{"completion_tokens":4}}\n\n'
    seen.take(events(burst), 2.0)
    seen.take(events(b'data: {"choices":[],"usage":{"completion_tokens":4}}\n\n'), 2.5)
    seen.take(events(b"data: [DONE]\n\n"), 3.0)
    assert seen.marks == [(1.0, 1), (2.0, 4)] and seen.generated == 4
    error = b'data: {"error":{"message":"KV pull failed","code":502}}\n\n'
    with pytest.raises(RuntimeError, match="stream error from http://e: KV pull failed"):
        seen.take(events(error), 4.0)
    with pytest.raises(RuntimeError, match="malformed event from http://e"):
        seen.take(events(b"data: {not json\n\n"), 4.0)


def test_time_batch_sends_prompts_of_the_asked_length(servers: Servers) -> None:
    """The step is timed on prompts of ``prompt_length`` characters (the emulator counts the
    prompt tokens it computes)."""
    engine = start_emulator(servers, timing=TIMING)
    computed: list[int] = []
    for length in (24, 600):
        before = engine.app.engine.counts["local_tokens"]
        sample = asyncio.run(
            time_batch(engine.url, "tiny-llama", 2, 5, random.Random(0), prompt_length=length)
        )
        assert sample.batch == 2 and sample.step_s > 0
        computed.append(engine.app.engine.counts["local_tokens"] - before)
    assert computed[1] > 10 * computed[0] > 0


def emulated_pair(servers: Servers) -> tuple[Emulator, Emulator]:
    producer = start_emulator(servers, role="prefill", timing=TIMING)
    consumer = start_emulator(servers, role="decode", timing=TIMING)
    return producer, consumer


def test_time_handoff_times_both_legs_of_a_real_handoff(servers: Servers) -> None:
    producer, consumer = emulated_pair(servers)
    with httpx.Client(timeout=10) as http:
        sample = time_handoff(http, producer.url, consumer.url, "x" * 40, "tiny-llama", 6)
    assert sample.prompt_tokens > 0
    assert sample.prefill_s > 0 and sample.first_token_s > 0
    assert sample.decode_s_per_token >= TIMING.decode_s_per_token * 0.5


def test_an_in_band_error_fails_the_handoff_instead_of_being_timed(servers: Servers) -> None:
    producer, consumer = emulated_pair(servers)
    consumer.faults({"kind": "inband_error", "after_tokens": 2, "code": 500})
    with httpx.Client(timeout=10) as http, pytest.raises(RuntimeError, match="stream error"):
        time_handoff(http, producer.url, consumer.url, "x" * 40, "tiny-llama", 6)
