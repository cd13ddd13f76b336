"""The recorded real-vLLM schedules (``data/vllm_schedules.json``) and how a record is compared
with the simulated engine's.

Each case is a closed workload (``requests``: [prompt tokens, output tokens]), the vLLM engine
arguments it ran with (``engine``: ``vllm.LLM`` keyword arguments; the model is the tiny test
model) and what vLLM 0.32.0's scheduler did (``vllm``: :mod:`tests.vllm.schedule_trace`'s
record). ``tests/vllm/test_b_scheduler_parity.py`` re-records them on the real CPU engine and
checks they did not change; regenerate the file with it (``NARWHAL_RECORD_SCHEDULES=1``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.parity.closed import simulate

DATA = Path(__file__).parent / "data" / "vllm_schedules.json"
Steps = list[tuple[dict[int, int], list[int]]]


def cases() -> list[dict[str, Any]]:
    return list(json.loads(DATA.read_text()))


def vllm_steps(record: dict[str, Any]) -> Steps:
    """A record's steps with integer request indices (JSON made them strings)."""
    return [({int(k): n for k, n in s["tokens"].items()}, s["preempted"]) for s in record["steps"]]


def simulated(case: dict[str, Any]) -> dict[str, Any]:
    """The case on the simulated engine, configured as the vLLM engine was: its sequence cap,
    token budget and block size, and vLLM's usable blocks (its pool keeps one null block)."""
    engine, record = case["engine"], case["vllm"]
    return simulate(
        [(prompt, out) for prompt, out in case["requests"]],
        max_num_seqs=engine["max_num_seqs"],
        max_num_batched_tokens=engine["max_num_batched_tokens"],
        block_size=record["block_size"],
        num_blocks=record["num_blocks"] - 1,
    )


def metrics_from_steps(case: dict[str, Any], steps: Steps) -> dict[str, float]:
    """What vLLM's counters must read after ``steps``: ``iteration_tokens_total`` counts, per
    step that emitted a token, its new prompt tokens (a prompt's, in the step its prefill ends)
    plus its sampled tokens — so its sum is prompt + generated tokens and a recomputation after
    a preemption adds nothing —, and ``num_preemptions`` every preemption."""
    requests = case["requests"]
    prompt = sum(p for p, _ in requests)
    generated = sum(out for _, out in requests)
    left = [p for p, _ in requests]  # tokens each still has to prefill, prompt + output
    done = [0] * len(requests)  # tokens each generated
    emitting = 0
    for tokens, preempted in steps:
        for i in preempted:
            left[i] = requests[i][0] + done[i]
        emitted = False
        for i, n in tokens.items():
            left[i] -= n
            if left[i] <= 0:
                done[i] += 1
                emitted = True
        emitting += emitted
    return {
        "vllm:num_preemptions": float(sum(len(p) for _, p in steps)),
        "vllm:prompt_tokens": float(prompt),
        "vllm:generation_tokens": float(generated),
        "iteration_tokens_sum": float(prompt + generated),
        "iteration_tokens_count": float(emitting),
    }
