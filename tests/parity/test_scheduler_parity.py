"""Scheduler parity with a real vLLM, independent of timing: the simulated engine, given the
configuration and closed workload a real vLLM 0.32.0 (CPU) engine ran, schedules the same steps:
the same tokens for the same requests in every step, and the same preemptions at the same steps.

The vLLM side is recorded (``data/vllm_schedules.json``; :mod:`tests.parity.schedules`), and
re-recorded on the real engine by the real-vLLM suite. The cases force chunked prefill (a token
budget below the prompts), the sequence cap, and preemption of a decode and of a running
prefill (a KV cache of a few blocks).
"""

from __future__ import annotations

import pytest

from tests.compiled_stage import EXPECT_COMPILED
from tests.parity.schedules import cases, metrics_from_steps, simulated, vllm_steps

CASES = cases()


@pytest.mark.skipif(
    EXPECT_COMPILED,
    reason="tests/parity/closed.py wraps Scheduler methods on the instance, which a compiled "
    "class does not allow (the compiled stage holds the compiled build's runs to the pure "
    "build's byte for byte)",
)
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_simulated_engine_schedules_what_vllm_scheduled(case: dict) -> None:  # type: ignore[type-arg]
    record = case["vllm"]
    sim = simulated(case)
    expected, got = vllm_steps(record), [(s["tokens"], s["preempted"]) for s in sim["steps"]]
    pairs = enumerate(zip(expected, got, strict=False))
    first = next((i for i, (want, have) in pairs if want != have), None)
    assert first is None and len(got) == len(expected), (
        f"first differing step {first}: vLLM {expected[first] if first is not None else None}, "
        f"sim {got[first] if first is not None else None}; steps {len(expected)} vs {len(got)}"
    )
    assert sim["outputs"] == record["outputs"] == [out for _, out in case["requests"]]
    assert sim["preemptions"] == record["metrics"]["vllm:num_preemptions"]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_the_recorded_steps_agree_with_vllms_own_counters(case: dict) -> None:  # type: ignore[type-arg]
    record = case["vllm"]
    assert metrics_from_steps(case, vllm_steps(record)) == record["metrics"]


def test_the_cases_exercise_chunking_the_cap_and_both_kinds_of_preemption() -> None:
    chunked = capped = preempted_prefill = preempted_decode = False
    for case in CASES:
        engine, steps = case["engine"], vllm_steps(case["vllm"])
        budget, cap = engine["max_num_batched_tokens"], engine["max_num_seqs"]
        chunked |= any(p > budget for p, _ in case["requests"])
        capped |= len(case["requests"]) > cap and any(len(t) == cap for t, _ in steps)
        for k, (_, preempted) in enumerate(steps):
            for i in preempted:  # a decode had 1 token in the step before; a prefill more
                if steps[k - 1][0].get(i, 0) > 1:
                    preempted_prefill = True
                else:
                    preempted_decode = True
    assert chunked and capped and preempted_prefill and preempted_decode
