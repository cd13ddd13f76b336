"""(default run, no vLLM) ``narwhal calibrate``'s fit on synthetic measurements, its ``[fleet]``
snippet in the simulator, and the linear timing's batch and KV-setup terms."""

from __future__ import annotations

import math
import tomllib

import pytest

from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario
from narwhal.sim.timing import LinearStepTiming
from narwhal.vllm.fit import engine_json, engine_report, fit_engine, fit_line
from narwhal.vllm.measure import HandoffSample, PrefillSample, StepSample

D, S, A, OVH, K, SETUP = 0.005, 0.0004, 0.0003, 0.02, 0.00002, 0.06
HANDOFF_D = 0.007  # the decode right after a KV pull, slower than the plain step


def synthetic() -> tuple[list[PrefillSample], list[StepSample], list[HandoffSample]]:
    prefill, handoffs = [], []
    for n in (17, 129, 385, 769):
        for noise in (1.0, 1.3, 0.99):  # the median of three repeats is the 1.0 one
            prefill.append(PrefillSample(n, (OVH + A * n + D) * noise))
            first = (SETUP + K * n + D) * noise
            handoffs.append(HandoffSample(n, (OVH + A * n + D) * noise, first, HANDOFF_D * noise))
    steps = [
        StepSample(b, (D + S * (b - 1)) * noise) for b in (1, 2, 4, 8) for noise in (1, 1.5, 1)
    ]
    return prefill, steps, handoffs


def test_fit_recovers_the_parameters() -> None:
    prefill, steps, handoffs = synthetic()
    fit = fit_engine("http://p", "http://d", "m", prefill, steps, handoffs)
    expected = {"overhead_s": OVH, "prefill_s_per_token": A, "decode_s_per_token": D,
                "decode_s_per_seq": S, "kv_s_per_token": K, "kv_setup_s": SETUP}  # fmt: skip
    for name, value in expected.items():
        assert fit.parameters()[name] == pytest.approx(value, rel=1e-6), name
    assert fit.fit_error()["all"] == pytest.approx(0.0, abs=1e-9)
    assert fit.handoff_decode_s_per_token == pytest.approx(HANDOFF_D)
    report = engine_report(fit)
    assert "fit error (mean |relative|): " in report
    assert "decode right after a KV pull (median over handoffs): 7.00 ms/token" in report
    fastest = fit_engine("http://p", "http://d", "m", prefill, steps, handoffs, "min")
    assert fastest.decode_s_per_token == pytest.approx(D)
    with pytest.raises(ValueError, match="statistic"):
        fit_engine("http://p", "http://d", "m", prefill, steps, handoffs, "mean")


def test_relative_line_keeps_the_small_points_when_one_point_is_far_off() -> None:
    xs, ys = [1, 2, 4, 8, 16], [0.00476, 0.00527, 0.00532, 0.00615, 0.03862]  # a knee at 16
    ordinary, relative = fit_line(xs, ys), fit_line(xs, ys, relative=True)
    assert ordinary.at(1) < 0.001  # pulled down to a tenth of the one-stream step by the knee
    assert relative.at(1) == pytest.approx(0.00476, rel=0.15)
    errors = [abs(relative.at(x) - y) / y for x, y in zip(xs, ys, strict=True)]
    assert sorted(errors)[2] < 0.15  # the median point within 15 %
    exact = fit_line([1, 2, 3], [2.0, 3.0, 4.0], relative=True)
    assert (exact.intercept, exact.slope) == pytest.approx((1.0, 1.0))
    with pytest.raises(ValueError):
        fit_line([1, 1], [1.0, 2.0], relative=True)
    with pytest.raises(ValueError):
        fit_line([1, 2], [0.0, 2.0], relative=True)


def test_single_engine_has_no_kv_term_and_errors_are_reported() -> None:
    prefill, steps, _ = synthetic()
    steps.append(StepSample(16, 0.02))  # off the line
    fit = fit_engine("http://e", "http://e", "m", prefill, steps, [])
    assert fit.kv_s_per_token == 0 and fit.kv_setup_s == 0
    assert fit.handoff_decode_s_per_token is None
    assert "after a KV pull" not in engine_report(fit)
    assert set(fit.fit_error()) == {"prefill", "step", "all"}
    assert fit.fit_error()["step"] > 0
    assert tomllib.loads(fit.toml())["fleet"]["both"] == 1


def test_snippet_is_toml_with_the_rounded_parameters_and_its_provenance() -> None:
    prefill, steps, handoffs = synthetic()
    fit = fit_engine("http://p", "http://d", "m", prefill, steps, handoffs)
    text = fit.toml()
    assert text.startswith(
        "# narwhal calibrate: http://p (prefill) -> http://d (decode), model m\n"
    )
    assert "# fit error (mean |relative|): " in text
    fleet = tomllib.loads(text)["fleet"]
    assert (fleet["prefill"], fleet["decode"], fleet["timing"]) == (1, 1, "linear")
    assert fleet["linear"] == {name: float(f"{v:.6g}") for name, v in fit.parameters().items()}
    data = engine_json(fit)
    assert (
        data["toml"] == text
        and data["handoff_decode_s_per_token"] == fit.handoff_decode_s_per_token
    )
    assert len(data["handoffs"]) == len(handoffs) and set(data["fit_error"]) >= {"all"}


def test_snippet_runs_in_the_simulator() -> None:
    prefill, steps, handoffs = synthetic()
    fit = fit_engine("http://p", "http://d", "m", prefill, steps, handoffs)
    text = fit.toml() + '\n[workload]\nkind = "fixed"\narrivals_s = [0.0]\nprompt_tokens = 385\n'
    assert tomllib.loads(text)["fleet"]["timing"] == "linear"
    result = run(parse_scenario(tomllib.loads(text)))
    (record,) = result.records
    assert record.status == 200 and record.first_byte_s is not None
    # prefill leg (overhead + a * P + d), then the KV pull (setup + k * P), then one step
    expected = (OVH + A * 385 + D) + (SETUP + K * 385) + D
    assert record.first_byte_s == pytest.approx(expected, rel=0.05)


def test_linear_timing_batch_term() -> None:
    timing = LinearStepTiming(decode_s_per_token=D, decode_s_per_seq=S, overhead_s=OVH,
                              prefill_s_per_token=A)  # fmt: skip
    assert timing.batch_s(1, 0, 0, 0.0) == D
    assert timing.batch_s(0, 10, 0, 0.0) == pytest.approx(D + OVH + A * 10)
    assert timing.batch_s(5, 0, 0, 0.0) == pytest.approx(D + 4 * S)
    assert math.isclose(LinearStepTiming(decode_s_per_token=D).batch_s(5, 0, 0, 0.0), D)
