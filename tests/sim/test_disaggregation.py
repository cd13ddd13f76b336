"""Per-request disaggregation in the simulator: a prompt below remote_prefill_min_tokens is
prefilled by its consumer (the consumer computes it, the producer does nothing), and with
no_producer = "local" a fleet whose producers are all down keeps serving from its consumers."""

from __future__ import annotations

from collections import Counter
from typing import Any

from narwhal.sim.runner import RunResult, run

from .conftest import scenario

MIXED: dict[str, Any] = {
    "workload": {"duration_s": 5.0, "prompt": {"dist": "uniform", "low": 100, "high": 3000}},
    # a 2048-token budget chunks the longer prompts, so a consumer computing them delays its
    # decodes (at vLLM's H200 default of 8192 each prompt is one step: no delay to show)
    "fleet": {"max_num_batched_tokens": 2048},
}
PRODUCERS = ("http://sim-p0", "http://sim-p1")
CONSUMERS = ("http://sim-d0", "http://sim-d1")


def simulate(routing: dict[str, Any], **extra: Any) -> RunResult:
    return run(scenario(routing=routing, **{**MIXED, **extra}))


def local(result: RunResult) -> list[dict[str, Any]]:
    return [d for d in result.decisions if d["kind"] == "prefill_local"]


def test_prompts_below_the_minimum_are_prefilled_by_their_consumer() -> None:
    remote = simulate({})
    mixed = simulate({"remote_prefill_min_tokens": 1000})
    assert all(r.status == 200 for r in mixed.records) and len(mixed.records) == len(remote.records)
    # the sim's prompt text is prompt - 1 bytes (the tokenizer adds BOS): the estimate
    short = {f"req-{i}" for i, a in enumerate(mixed.arrivals) if a.prompt - 1 < 1000}
    decided = local(mixed)
    assert {d["request"] for d in decided} == short and short
    assert Counter(d["reason"] for d in decided) == {"short_prompt": len(short)}
    by_id = {r.request_id: r for r in mixed.records}
    assert all(len(by_id[rid].engines) == 1 and by_id[rid].ttft_s is None for rid in short)
    assert all(len(r.engines) == 2 for r in mixed.records if r.request_id not in short)
    assert local(remote) == []


def test_a_local_prefill_is_the_consumers_compute_and_spares_the_producers() -> None:
    remote = simulate({})
    whole = simulate({"remote_prefill_min_tokens": 100_000})  # every prompt is short
    assert all(r.status == 200 for r in whole.records)
    for url in PRODUCERS:
        assert remote.engines[url]["steps"] > 0 and whole.engines[url]["steps"] == 0
    busy = {url: (remote.engines[url]["busy_s"], whole.engines[url]["busy_s"]) for url in CONSUMERS}
    assert all(local_s > remote_s for remote_s, local_s in busy.values()), busy
    # computing its own prompts delays each consumer's first tokens
    first = sorted(r.first_byte_s or 0 for r in whole.records)
    first_remote = sorted(r.first_byte_s or 0 for r in remote.records)
    assert first[len(first) // 2] > first_remote[len(first_remote) // 2]


PRODUCERS_DOWN: dict[str, Any] = {
    "faults": [{"kind": "crash", "role": "prefill", "count": 2, "at_s": 1.0, "duration_s": 3.0}],
    "recovery": {"eject_after": 1, "probe_interval_s": 0.5},
}


def test_with_no_producer_local_the_consumers_serve_while_every_producer_is_down() -> None:
    failing = simulate({"no_producer": "fail"}, **PRODUCERS_DOWN)
    serving = simulate({"no_producer": "local"}, **PRODUCERS_DOWN)
    statuses = Counter(r.status for r in failing.records)
    assert statuses[503] > 0  # no producer placeable: 503 + Retry-After
    reasons = Counter(d["reason"] for d in local(serving))
    assert reasons["no_producer"] > 0 and set(reasons) == {"no_producer"}
    assert Counter(r.status for r in serving.records)[503] == 0
    ok = sum(r.status == 200 for r in serving.records)
    assert ok > statuses[200]
