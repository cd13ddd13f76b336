"""``[fleet] timing = "linear"`` (the emulator's timing) and ``[workload] kind = "fixed"``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from narwhal.emulator.timing import LinearTiming
from narwhal.sim.results import goodput_sweep
from narwhal.sim.runner import run
from narwhal.sim.scenario import Scenario, ScenarioError, parse_scenario
from narwhal.sim.timing import LinearStepTiming, StepModel
from narwhal.sim.workload import Arrival, WorkloadSettings, generate
from tests.sim.conftest import BASE, merge, scenario

LINEAR = {
    "prefill_s_per_token": 1e-4,
    "decode_s_per_token": 0.005,
    "kv_s_per_token": 2e-5,
    "overhead_s": 0.005,
}


def _fixed(**extra: Any) -> dict[str, Any]:
    return {"kind": "fixed", "arrivals_s": [0.5, 1.0, 1.0, 2.5], **extra}


def _scenario(fleet: dict[str, Any], workload: dict[str, Any] | None = None) -> Scenario:
    """The test scenario with ``fleet`` merged in (without its jitter) and ``workload``."""
    data = merge(BASE, {"fleet": fleet})
    if "jitter" not in fleet:
        del data["fleet"]["jitter"]
    if workload is not None:
        data["workload"] = workload
    return parse_scenario(data, "test")


def test_fixed_arrivals_are_the_listed_times_with_the_given_lengths() -> None:
    w = WorkloadSettings.model_validate(_fixed(prompt_tokens=100, output_tokens=8))
    assert generate(w, random.Random(1)) == [
        Arrival(0.5, 100, 8),
        Arrival(1.0, 100, 8),
        Arrival(1.0, 100, 8),
        Arrival(2.5, 100, 8),
    ]
    cut = WorkloadSettings.model_validate(_fixed(max_requests=2, max_prompt_tokens=50))
    assert generate(cut, random.Random(1)) == [Arrival(0.5, 50, 16), Arrival(1.0, 50, 16)]
    assert (
        len(generate(WorkloadSettings.model_validate(_fixed(duration_s=1.0)), random.Random())) == 1
    )


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"kind": "fixed"}, "needs 'arrivals_s'"),
        ({"kind": "fixed", "arrivals_s": []}, "needs 'arrivals_s'"),
        ({"kind": "fixed", "arrivals_s": [1.0, 0.5]}, "non-decreasing"),
        ({"kind": "fixed", "arrivals_s": [-1.0]}, ">= 0"),
        ({"kind": "fixed", "arrivals_s": [1.0], "output_tokens": 0}, "greater than or equal"),
        ({"kind": "fixed", "arrivals_s": [1.0], "prompt": {"value": 9}}, "takes 'prompt_tokens'"),
        ({"kind": "poisson", "duration_s": 5.0, "arrivals_s": [1.0]}, "arrivals_s: only for"),
        ({"kind": "trace", "duration_s": 5.0, "prompt_tokens": 10}, "prompt_tokens: only for"),
    ],
)
def test_fixed_workload_is_validated(workload: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        _scenario({}, workload)


def test_linear_step_times_are_the_emulators() -> None:
    step = LinearStepTiming(
        prefill_s_per_token=LINEAR["prefill_s_per_token"],
        decode_s_per_token=LINEAR["decode_s_per_token"],
        kv_s_per_token=LINEAR["kv_s_per_token"],
        overhead_s=LINEAR["overhead_s"],
    )
    emulator = LinearTiming(**LINEAR)
    # a prefill leg (one step: the prompt, then one token) takes what the emulator sleeps
    expected = emulator.prefill_s(100) + emulator.decode_token_s(100)
    assert step.batch_s(0, 100, 0, 5000.0) == pytest.approx(expected)
    assert step.batch_s(3, 0, 900, 0.0) == pytest.approx(emulator.decode_token_s(300))
    # a KV pull of 100 tokens over a link sized by link_bandwidth_gbps
    seconds = 100 * step.kv_bytes_per_token / (step.link_bandwidth_gbps() * 1e9)
    assert seconds == pytest.approx(emulator.kv_transfer_s(100))
    assert LinearStepTiming().link_bandwidth_gbps() > 1e6  # kv 0: as good as instantaneous


def test_fitted_model_batch_s_is_step_s() -> None:
    model = scenario().fleet.step_timing()
    assert isinstance(model, StepModel)
    assert model.batch_s(5, 200, 4000, 20000.0) == model.step_s(205, 4000, 20000.0)


def test_a_linear_fleet_times_each_request_as_the_emulator_does() -> None:
    """One request at a time: ttft, first byte and end are the emulator's sums, exactly."""
    fleet = {"prefill": 1, "decode": 1, "timing": "linear", "linear": LINEAR}
    result = run(_scenario(fleet, _fixed(prompt_tokens=100, output_tokens=8)))
    emulator = LinearTiming(**LINEAR)
    prefill_leg = emulator.prefill_s(100) + emulator.decode_token_s(100)  # then 1 token
    first = prefill_leg + emulator.kv_transfer_s(100) + emulator.decode_token_s(100)
    end = prefill_leg + emulator.kv_transfer_s(100) + 8 * emulator.decode_token_s(100)
    assert [r.status for r in result.records] == [200] * 4
    alone = [r for r in result.records if r.arrival in (0.5, 2.5)]
    assert len(alone) == 2
    for record in alone:
        assert record.ttft_s == pytest.approx(prefill_leg)
        assert record.first_byte_s == pytest.approx(first)
        assert record.finished_s == pytest.approx(end)
    # the two requests at 1.0 s share one prefill step (continuous batching; the emulator
    # would serve them side by side): documented, and why the parity test keeps them apart
    together = [r for r in result.records if r.arrival == 1.0]
    shared = emulator.prefill_s(200) + emulator.decode_token_s(200)
    assert [r.ttft_s for r in together] == pytest.approx([shared, shared])
    assert result.policy_seed != 0


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ({"linear": LINEAR}, 'needs timing = "linear"'),
        ({"timing": "linear", "step_overhead_ms": 1.0}, "step_overhead_ms: not used with"),
        ({"timing": "linear", "step_overhead_per_seq_us": 5.0}, "step_overhead_per_seq_us: not"),
        ({"timing": "linear", "link_bandwidth_gbps": 10.0}, "link_bandwidth_gbps: not used"),
        ({"timing": "linear", "linear": {"decode_s_per_token": -1.0}}, "greater than or equal"),
        ({"timing": "linear", "linear": {"decode_s": 1.0}}, "unknown key"),
    ],
)
def test_linear_fleet_is_validated(fleet: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        _scenario(fleet)


def test_goodput_sweep_compresses_fixed_arrivals() -> None:
    base = _scenario({}, _fixed())
    points = goodput_sweep(base, [1.0, 2.0])["points"]
    assert points[1]["offered_rps"] == pytest.approx(2 * points[0]["offered_rps"])
