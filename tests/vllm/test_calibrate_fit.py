"""(default run, no vLLM) ``narwhal calibrate``'s fit on synthetic measurements, its ``[fleet]``
snippet in the simulator, and the linear timing's batch and KV-setup terms."""

from __future__ import annotations

import asyncio
import math
import random
import tomllib
from pathlib import Path

import pytest

from narwhal.cli import build_parser, main
from narwhal.emulator.timing import LinearTiming
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario
from narwhal.sim.timing import LinearStepTiming
from narwhal.vllm.calibrate import (
    PrefillSample,
    Sample,
    StepSample,
    engine_report,
    fit_engine,
    fit_line,
    steady_step_s,
    time_batch,
)
from narwhal.vllm.calibrate import main as calibrate_pair
from tests.live.conftest import Servers, start_emulator

D, S, A, OVH, K, SETUP = 0.005, 0.0004, 0.0003, 0.02, 0.00002, 0.06


def synthetic() -> tuple[list[PrefillSample], list[StepSample], list[Sample]]:
    prefill, handoffs = [], []
    for n in (17, 129, 385, 769):
        for noise in (1.0, 1.3, 0.99):  # the median of three repeats is the 1.0 one
            prefill.append(PrefillSample(n, (OVH + A * n + D) * noise))
            handoffs.append(Sample(n, (OVH + A * n + D) * noise, (SETUP + K * n + D) * noise, D))
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
    assert "fit error (mean |relative|): " in engine_report(fit)
    fastest = fit_engine("http://p", "http://d", "m", prefill, steps, handoffs, "min")
    assert fastest.decode_s_per_token == pytest.approx(D)


def test_relative_line_keeps_the_small_points_when_one_point_is_far_off() -> None:
    xs, ys = [1, 2, 4, 8, 16], [0.00476, 0.00527, 0.00532, 0.00615, 0.03862]  # run G's steps
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
    assert set(fit.fit_error()) == {"prefill", "step", "all"}
    assert fit.fit_error()["step"] > 0
    assert "both = 1" in fit.toml()


def test_steady_window() -> None:
    # stream a: a token every 10 ms from t=0; stream b joins at 0.1 s: steps slow to 20 ms
    a = [(i * 0.01, i + 1) for i in range(10)] + [(0.09 + j * 0.02, 11 + j) for j in range(1, 20)]
    b = [(0.1 + j * 0.02, 1 + j) for j in range(20)]
    assert steady_step_s([a, b]) == pytest.approx(0.02)
    assert steady_step_s([a[:10]]) == pytest.approx(0.01)


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


def test_command_is_registered() -> None:
    args = build_parser().parse_args(
        ["calibrate", "--engine", "http://e", "--batches", "1,4", "--out", "f.toml"]
    )
    assert args.batches == [1, 4] and args.decode_engine is None and args.statistic == "median"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calibrate", "--engine", "http://e", "--batches", "0"])


def test_time_batch_sends_prompts_of_the_asked_length() -> None:
    """Over loopback against an emulated engine: the step is timed on prompts of
    ``prompt_length`` characters (the emulator counts the prompt tokens it computes)."""
    running = Servers()
    try:
        engine = start_emulator(running, timing=LinearTiming(decode_s_per_token=0.002))
        computed: list[int] = []
        for length in (24, 600):
            before = engine.app.engine.counts["local_tokens"]
            sample = asyncio.run(
                time_batch(engine.url, "tiny-llama", 2, 5, random.Random(0), prompt_length=length)
            )
            assert sample.batch == 2 and sample.step_s > 0
            computed.append(engine.app.engine.counts["local_tokens"] - before)
    finally:
        running.stop_all()
    assert computed[1] > 10 * computed[0] > 0


@pytest.mark.parametrize("lengths", ["16", "16,16", "16,abc", "0,16"])
def test_a_list_that_cannot_be_fitted_is_refused_at_once(lengths: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calibrate", "--engine", "http://e", "--lengths", lengths])


def test_an_unwritable_output_is_refused_before_any_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the engine is unreachable: measuring would end in exit 1, refusing first gives 2
    missing = tmp_path / "absent" / "fleet.toml"
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", "--out", str(missing)]) == 2
    assert f"--out: no such directory: {missing.parent}" in capsys.readouterr().err
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", "--json", str(tmp_path)]) == 2


@pytest.mark.parametrize("counts", [["--repeats", "0"], ["--tokens", "7"]])
def test_too_few_repeats_or_tokens_are_refused_by_both_calibrate_commands(
    counts: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # the engines are unreachable: measuring would end in exit 1, refusing first gives 2
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", *counts]) == 2
    assert "--repeats must be >= 1 and --tokens >= 8" in capsys.readouterr().err
    pair = ["--producer", "http://127.0.0.1:9", "--consumer", "http://127.0.0.1:9", *counts]
    with pytest.raises(SystemExit) as exit_info:
        calibrate_pair(pair)
    assert exit_info.value.code == 2
    assert "--repeats must be >= 1 and --tokens >= 8" in capsys.readouterr().err
