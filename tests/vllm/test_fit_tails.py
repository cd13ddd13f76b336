"""(default run, no vLLM) ``narwhal calibrate``'s step noise and host overhead: recovered from
synthetic measurements of known parameters, and from a simulated engine's own token times."""

from __future__ import annotations

import random
import tomllib
from typing import Any

import pytest

from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.stepcost import StepCost
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario
from narwhal.sim.timing import step_model
from narwhal.vllm.fit import engine_report, fit_engine
from narwhal.vllm.fit_tails import fit_host_overhead, fit_ratios, fit_step_tail
from narwhal.vllm.measure import PrefillSample, StepSample, step_gaps
from tests.sim.test_engine import make, read_stream

BATCHES = (1, 2, 4, 8, 16)


def noisy_steps(
    jitter: float, rate: float, factor: float, per_batch: int, base_s: float = 0.004
) -> list[StepSample]:
    """Per-step times drawn from the simulator's own step noise around a step per batch."""
    cost = StepCost(
        EngineParams(
            model="llama3-8b",
            step_overhead_s=0.0,
            jitter=jitter,
            straggler_rate=rate,
            straggler_factor=factor,
        )
    )
    rng = random.Random(5)
    steps = []
    for b in BATCHES:
        typical = base_s + 0.0003 * b
        gaps = tuple(cost.seconds(typical, b, b, rng) for _ in range(per_batch))
        steps.append(StepSample(b, typical, gaps))
    return steps


@pytest.mark.parametrize(
    ("jitter", "rate", "factor"),
    [(0.05, 0.02, 3.0), (0.1, 0.05, 2.0), (0.02, 0.01, 8.0), (0.2, 0.0, 1.0)],
)
def test_the_tail_is_recovered_within_tolerance(jitter: float, rate: float, factor: float) -> None:
    # 5 batches x 600 steps: the rate within 0.01 (about 3 standard errors at 5 %), the body
    # and the factor within 10 %
    tail = fit_step_tail(noisy_steps(jitter, rate, factor, 600))
    assert tail is not None and tail.steps == 3000
    assert tail.jitter == pytest.approx(jitter, rel=0.1)
    assert tail.straggler_rate == pytest.approx(rate, abs=0.01)
    assert tail.straggler_factor == pytest.approx(factor, rel=0.1)
    if rate == 0:
        assert (tail.straggler_rate, tail.straggler_factor) == (0.0, 1.0)


def test_steady_steps_have_no_noise_and_too_few_have_no_fit() -> None:
    tail = fit_ratios([1.0] * 40)
    assert (tail.jitter, tail.straggler_rate, tail.straggler_factor) == (0.0, 0.0, 1.0)
    assert fit_step_tail([StepSample(1, 0.01, (0.01,) * 19)]) is None
    assert fit_step_tail([StepSample(1, 0.01)]) is None  # samples of an older calibration
    with pytest.raises(ValueError, match="at least 20"):
        fit_ratios([1.0] * 19)


def test_a_straggler_milder_than_the_threshold_is_body() -> None:
    ratios = [1.0] * 90 + [1.49] * 10  # under 1.5x: widens nothing, counted as body
    assert fit_ratios(ratios).straggler_rate == 0.0
    assert fit_ratios([1.0] * 90 + [1.51] * 10).straggler_rate == pytest.approx(0.1)


def test_host_overhead_is_recovered_exactly_from_steps_beyond_the_profile() -> None:
    gpu, context = step_model("llama3-8b"), 49
    steps = [gpu.batch_s(b, 0, b * context, 0.0) + 0.003 + 25e-6 * b for b in BATCHES]
    host = fit_host_overhead(BATCHES, steps, "llama3-8b", context)
    assert host.step_overhead_s == pytest.approx(0.003, rel=1e-9)
    assert host.per_seq_s == pytest.approx(25e-6, rel=1e-6)
    faster = fit_host_overhead(BATCHES, [s - 0.01 for s in steps], "llama3-8b", context)
    assert faster.step_overhead_s == 0.0  # clamped, never negative
    with pytest.raises(ValueError, match="two batch sizes"):
        fit_host_overhead([4, 4], steps[:2], "llama3-8b", context)


def test_step_gaps_merge_one_read_and_spread_a_burst() -> None:
    first = [(0.0, 1), (0.01, 2), (0.02, 3), (0.02, 4), (0.06, 8), (0.07, 9), (0.5, 10)]
    other = [(0.005, 1), (0.07, 7)]  # every stream decoding from 0.005 to 0.07
    # 0.01 -> 0.02 brought two tokens in one read; the late burst of four spreads its wait
    assert step_gaps([first, other]) == pytest.approx((0.005, 0.01, 0.01))
    assert step_gaps([]) == ()


def test_step_gaps_read_the_stream_with_most_steps_in_the_window_or_the_whole_first() -> None:
    first = [(0.0, 1), (0.01, 2), (0.02, 3), (0.03, 4)]
    # the second stream's whole body arrived late, in one read: the window (0.03 to 0.03)
    # holds one arrival of each stream, so the first stream's whole span stands in
    late = [(0.03, 1), (0.03, 4)]
    assert step_gaps([first, late]) == pytest.approx((0.01, 0.01, 0.01))
    # a window the first stream reaches with one arrival but the other with three
    sparse = [(0.0, 1), (0.05, 5), (0.1, 6)]
    dense = [(0.01, 1), (0.02, 2), (0.03, 3), (0.05, 5), (0.2, 9)]
    assert step_gaps([sparse, dense]) == pytest.approx((0.01, 0.01, 0.01))


def _fleet(fit_text: str) -> dict[str, Any]:
    return tomllib.loads(fit_text)["fleet"]


WORKLOAD = '\n[workload]\nkind = "fixed"\narrivals_s = [0.0]\nprompt_tokens = 100\n'


def _fit(base_s: float = 0.004, **extra: Any) -> Any:
    prefill = [PrefillSample(n, 0.02 + 0.0003 * n) for n in (17, 129, 385)]
    steps = noisy_steps(0.05, 0.02, 3.0, 600, base_s)
    return fit_engine("http://e", "http://e", "m", prefill, steps, [], **extra)


def test_the_snippet_carries_the_noise_with_the_linear_timing_and_runs() -> None:
    fit = _fit()
    fleet = _fleet(fit.toml())
    assert fleet["timing"] == "linear" and "# step noise from 3000 measured steps" in fit.toml()
    assert fleet["jitter"] == pytest.approx(0.05, rel=0.1)
    assert fleet["straggler_rate"] == pytest.approx(0.02, abs=0.01)
    assert "step noise (3000 steps" in engine_report(fit)
    params = parse_scenario(tomllib.loads(fit.toml() + WORKLOAD)).fleet.engine_params()
    assert params.straggler_factor == pytest.approx(3.0, rel=0.1)


def test_with_a_profile_model_the_snippet_is_the_fitted_timing_with_host_overhead() -> None:
    fit = _fit(0.02, profile_model="llama3-8b", context_per_seq=49)
    fleet = _fleet(fit.toml())
    assert (fleet["model"], fleet["timing"]) == ("llama3-8b", "fitted")
    assert fleet["step_overhead_ms"] > 0 and fleet["step_overhead_per_seq_us"] > 0
    assert "linear" not in fleet
    assert "host overhead beyond profile model llama3-8b" in engine_report(fit)
    (record,) = run(parse_scenario(tomllib.loads(fit.toml() + WORKLOAD))).records
    assert record.status == 200


def test_the_fit_recovers_a_simulated_engine_s_stragglers_from_its_token_times() -> None:
    # calibrate's measuring path against the simulator itself: one stream's token times
    env, _engine, transport = make(jitter=0.05, straggler_rate=0.05, straggler_factor=3.0)
    out: dict[str, Any] = {}
    read_stream(env, transport, {"prompt": "x" * 23, "max_tokens": 1500, "stream": True}, out)
    env.run(until=120.0)
    marks = [(at, i + 1) for i, at in enumerate(out["times"])]
    tail = fit_step_tail([StepSample(1, 0.0, step_gaps([marks]))])
    assert tail is not None and tail.steps == 1499
    assert tail.jitter == pytest.approx(0.05, rel=0.15)
    assert tail.straggler_rate == pytest.approx(0.05, abs=0.015)
    assert tail.straggler_factor == pytest.approx(3.0, rel=0.1)
