"""Timing a live OpenAI-compatible vLLM engine over HTTP: prefill legs, KV handoffs and batched
decode steps, as ``narwhal calibrate`` measures them.

Rule: measure only what a router sees, through the engines' public HTTP API: unique prompts (no
prefix-cache hits), greedy decoding with ``ignore_eos`` (every stream runs to ``max_tokens``),
token counts from the engine's ``usage`` (so any tokenizer works, and a chunk that carries
several tokens is counted right). Streams are read with the router's own SSE reader
(:class:`narwhal.core.sse.SseParser`): an in-band error or a malformed event fails the
measurement instead of being timed.

Theory of operation:

- :func:`time_prefill`: one non-streamed one-token completion; its HTTP round trip against the
  prompt's tokens.
- :func:`time_handoff`: the prefill leg on the producer with the prefill leg's
  ``kv_transfer_params`` (the router's own, :func:`narwhal.core.descriptor.prefill_kv_params`),
  then a streamed decode on the consumer with the descriptor it returned: the prefill's round
  trip, the decode leg's time to its first token (the KV pull, then one step) and its time per
  token after the first (first to last token over ``usage``'s count less one).
- :func:`time_batch`: the decode step of ``B`` concurrent streams. A client's clock cannot see
  a step directly on a busy machine: when the API server is starved of CPU the engine keeps
  stepping and the tokens arrive later in a burst, so gaps between chunks read as zero. The
  send time is immune to that and the last token is only ever late, so ``B`` streams of ``T``
  tokens against ``B`` one-token streams, sent at once, give the step as the difference of
  their spans over ``T - 1`` (not biased low); when noise makes it <= 0,
  :func:`steady_step_s` reads it from the window in which every stream was decoding. The same
  window gives the step-to-step spread (:func:`step_gaps`), from which the fit reads the
  step-time tail.

Uses httpx (a project dependency); never touches torch or vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from narwhal.core.descriptor import prefill_kv_params
from narwhal.core.sse import EventKind, SseEvent, SseParser

ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:"
CONNECTOR = "NixlConnector"


@dataclass(frozen=True)
class PrefillSample:
    """One one-token completion: prompt tokens (from ``usage``) and its HTTP round trip."""

    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class HandoffSample:
    """One timed handoff: producer leg, then the consumer's streamed decode."""

    prompt_tokens: int
    prefill_s: float  # producer HTTP leg, one-token completion
    first_token_s: float  # consumer: request sent -> first generated token
    decode_s_per_token: float  # consumer: first -> last token, over the tokens after the first


@dataclass(frozen=True)
class StepSample:
    """``batch`` concurrent streams: the decode step time while all of them were decoding."""

    batch: int
    step_s: float
    # one stream's time per token between arrivals while every stream decoded (the tail)
    gaps: tuple[float, ...] = ()


@dataclass
class StreamMarks:
    """What one stream's events said, each token event with the time its bytes arrived."""

    source: str
    marks: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens so far)
    generated: int = 0  # the last ``usage.completion_tokens`` seen

    def take(self, events: Iterable[SseEvent], now: float) -> None:
        """Record the events of one chunk of bytes that arrived at ``now``."""
        for event in events:
            if event.kind is EventKind.ERROR:
                raise RuntimeError(
                    f"stream error from {self.source}: {event.error_message} "
                    f"(status {event.error_status})"
                )
            if event.kind is EventKind.MALFORMED:
                raise RuntimeError(f"malformed event from {self.source}: {event.data[:200]!r}")
            usage = (event.payload or {}).get("usage") or {}
            used = usage.get("completion_tokens")
            if isinstance(used, int) and used > 0:
                self.generated = used
            if event.kind is EventKind.TOKEN:
                count = used if isinstance(used, int) and used > 0 else self.tokens_so_far() + 1
                self.marks.append((now, count))

    def tokens_so_far(self) -> int:
        return self.marks[-1][1] if self.marks else 0


def unique_prompt(length: int, rng: random.Random) -> str:
    """``length`` characters (``length + 1`` tokens with the tiny model) never sent before."""
    head = uuid.uuid4().hex[:12] + " "
    return (head + "".join(rng.choice(ALPHABET) for _ in range(length)))[:length]


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy completion that runs to ``max_tokens`` (vLLM's ``ignore_eos``)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def served_model(http: httpx.Client, engine: str) -> str:
    """The first model ``GET /v1/models`` lists."""
    reply = http.get(engine + "/v1/models")
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])


def time_prefill(http: httpx.Client, engine: str, model: str, prompt: str) -> PrefillSample:
    """One non-streamed one-token completion, timed over HTTP."""
    started = time.perf_counter()
    reply = http.post(engine + "/v1/completions", json=completion_body(model, prompt, 1))
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    return PrefillSample(int(reply.json()["usage"]["prompt_tokens"]), seconds)


def time_handoff(
    http: httpx.Client, producer: str, consumer: str, prompt: str, model: str, tokens: int
) -> HandoffSample:
    """One handoff of ``prompt``: the producer's prefill leg, then ``tokens`` streamed from the
    consumer with the producer's descriptor."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "temperature": 0}
    started = time.perf_counter()
    reply = http.post(
        producer + "/v1/completions",
        json={
            **body,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": prefill_kv_params(CONNECTOR),
        },
    )
    prefill_s = time.perf_counter() - started
    reply.raise_for_status()
    answer = reply.json()
    decode = {
        **body,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "kv_transfer_params": answer["kv_transfer_params"],
    }
    seen = StreamMarks(consumer)
    parser = SseParser()
    started = time.perf_counter()
    with http.stream("POST", consumer + "/v1/completions", json=decode) as stream:
        stream.raise_for_status()
        for chunk in stream.iter_bytes():
            seen.take(parser.feed(chunk), time.perf_counter())
    if not seen.marks or seen.generated < 2:
        raise RuntimeError(f"consumer generated {seen.generated} tokens, expected {tokens}")
    # A chunk may carry several tokens when the engine is behind; the first carries one.
    first, last = seen.marks[0][0], seen.marks[-1][0]
    per_token = (last - first) / (seen.generated - 1)
    prompt_tokens = int(answer["usage"]["prompt_tokens"])
    return HandoffSample(prompt_tokens, prefill_s, first - started, per_token)


async def _stream_marks(
    http: httpx.AsyncClient, engine: str, body: dict[str, Any]
) -> list[tuple[float, int]]:
    """(time, tokens generated so far) at every event that carried text."""
    seen = StreamMarks(engine)
    parser = SseParser()
    async with http.stream("POST", engine + "/v1/completions", json=body) as stream:
        stream.raise_for_status()
        async for chunk in stream.aiter_bytes():
            seen.take(parser.feed(chunk), time.perf_counter())
    return seen.marks


def _all_decoding(streams: Sequence[Sequence[tuple[float, int]]]) -> tuple[float, float]:
    """The window in which every (non-empty) stream was decoding: from the last stream's first
    token to the first stream's last."""
    return max(marks[0][0] for marks in streams), min(marks[-1][0] for marks in streams)


def steady_step_s(streams: Sequence[Sequence[tuple[float, int]]]) -> float:
    """The step time while every stream was decoding: in the window from the last stream's
    first token to the first stream's last token, each stream's time per token; the median.
    A window too short (under 4 tokens of a stream) falls back to the whole stream."""
    streams = [marks for marks in streams if marks]
    if not streams:
        raise RuntimeError("no stream generated any text: no decode step to time")
    start, end = _all_decoding(streams)
    per_token: list[float] = []
    for marks in streams:
        inside = [m for m in marks if start <= m[0] <= end]
        if len(inside) < 2 or inside[-1][1] - inside[0][1] < 4:
            inside = list(marks)
        tokens = inside[-1][1] - inside[0][1]
        if tokens > 0:
            per_token.append((inside[-1][0] - inside[0][0]) / tokens)
    if not per_token:
        raise RuntimeError("streams generated under two tokens: no decode step to time")
    return statistics.median(per_token)


def step_gaps(streams: Sequence[Sequence[tuple[float, int]]]) -> tuple[float, ...]:
    """Per-step times in the window in which every stream was decoding (all of a batch's
    streams share its steps, so one stream is the batch's steps): between two arrivals of the
    stream with the most arrivals in the window, the time over the tokens the later one
    brought. Events read together (one arrival time) are one arrival; a burst the API server
    delivered late reads as the mean of its steps, never as zero-length steps. On a starved
    machine a stream can arrive late and whole, leaving the window under two arrivals of any
    stream; then the first stream's whole span stands in (its edges ran at a smaller batch)."""
    streams = [marks for marks in streams if marks]
    if not streams:
        return ()
    start, end = _all_decoding(streams)
    inside = max(
        (_arrivals(m for m in marks if start <= m[0] <= end) for marks in streams), key=len
    )
    if len(inside) < 2:
        inside = _arrivals(streams[0])
    return tuple(
        (t1 - t0) / (c1 - c0) for (t0, c0), (t1, c1) in itertools.pairwise(inside) if c1 > c0
    )


def _arrivals(marks: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """(time, tokens so far) marks with those read together (one time) merged into one."""
    arrivals: list[tuple[float, int]] = []
    for at, count in marks:
        if arrivals and arrivals[-1][0] == at:
            arrivals[-1] = (at, count)
        else:
            arrivals.append((at, count))
    return arrivals


async def _batch_span(
    http: httpx.AsyncClient,
    engine: str,
    body: dict[str, Any],
    batch: int,
    rng: random.Random,
    prompt_length: int,
) -> tuple[float, list[list[tuple[float, int]]]]:
    """``batch`` concurrent streams: seconds from sending them to the last token of all."""
    prompts = [unique_prompt(prompt_length, rng) for _ in range(batch)]
    sent = time.perf_counter()
    streams = await asyncio.gather(
        *(_stream_marks(http, engine, {**body, "prompt": prompt}) for prompt in prompts)
    )
    if not any(streams):
        raise RuntimeError(f"no stream from {engine} generated any text")
    return max(marks[-1][0] for marks in streams if marks) - sent, streams


async def time_batch(
    engine: str,
    model: str,
    batch: int,
    tokens: int,
    rng: random.Random,
    timeout: float = 300,
    prompt_length: int = 24,
) -> StepSample:
    """The decode step of ``batch`` concurrent streams (unique prompts of ``prompt_length``
    characters, short by default): the span from sending ``batch`` streams of ``tokens`` tokens
    to their last token, less the span of ``batch`` one-token streams (the prefill and the HTTP
    round trip), over ``tokens - 1``; <= 0 (noise): :func:`steady_step_s` instead."""
    body = {
        **completion_body(model, "", tokens),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    limits = httpx.Limits(max_connections=batch + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        one = {**body, "max_tokens": 1}
        short, _ = await _batch_span(http, engine, one, batch, rng, prompt_length)
        full, streams = await _batch_span(http, engine, body, batch, rng, prompt_length)
    step = (full - short) / (tokens - 1)
    return StepSample(batch, step if step > 0 else steady_step_s(streams), step_gaps(streams))
