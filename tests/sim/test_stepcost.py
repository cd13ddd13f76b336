"""Step cost: host overhead that grows with the batch, and step noise with stragglers (one draw
per step; the defaults give a flat overhead with uniform jitter, float for float)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.stepcost import StepCost
from narwhal.sim.scenario import Scenario, ScenarioError, parse_scenario
from tests.sim.conftest import BASE, merge
from tests.sim.test_engine import make, read_stream


class Draws(random.Random):
    """A Random whose ``random()`` answers the given values in turn (exact boundaries)."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def cost(**params: Any) -> StepCost:
    return StepCost(EngineParams(model="llama3-8b", **params))


def test_defaults_are_a_flat_overhead_with_uniform_jitter_float_for_float() -> None:
    step = cost()
    ours, theirs = random.Random(7), random.Random(7)
    for gpu_s in (0.0, 0.0123, 0.5, 1e-4):
        expected = gpu_s + 0.002
        expected *= 1.0 + 0.05 * (2.0 * theirs.random() - 1.0)
        assert step.seconds(gpu_s, 100, 2048, ours) == expected  # the same float
    assert ours.getstate() == theirs.getstate()  # one draw per step, as before


def test_no_noise_takes_no_draw() -> None:
    rng = random.Random(3)
    state = rng.getstate()
    assert cost(jitter=0.0).seconds(0.01, 4, 4, rng) == 0.01 + 0.002
    assert rng.getstate() == state


def test_host_overhead_grows_with_sequences_and_tokens() -> None:
    step = cost(step_overhead_per_seq_s=1e-5, step_overhead_per_token_s=1e-7, jitter=0.0)
    assert step.seconds(0.01, 0, 0, random.Random()) == pytest.approx(0.012, abs=1e-15)
    assert step.seconds(0.01, 256, 2048, random.Random()) == pytest.approx(
        0.012 + 256e-5 + 2048e-7, abs=1e-15
    )


def test_straggler_boundary_is_below_the_rate() -> None:
    step = cost(jitter=0.0, straggler_rate=0.25, straggler_factor=3.0)
    g = 0.01 + 0.002
    assert step.seconds(0.01, 1, 1, Draws(0.0)) == pytest.approx(3 * g)
    assert step.seconds(0.01, 1, 1, Draws(0.25 - 1e-12)) == pytest.approx(3 * g)
    assert step.seconds(0.01, 1, 1, Draws(0.25)) == pytest.approx(g)  # u == p: not one
    assert step.seconds(0.01, 1, 1, Draws(0.999)) == pytest.approx(g)


def test_the_body_spans_the_jitter_on_both_sides_of_the_straggler_split() -> None:
    step = cost(step_overhead_s=0.0, jitter=0.1, straggler_rate=0.2, straggler_factor=5.0)
    # V = U / p within stragglers, (U - p) / (1 - p) outside: each covers the whole body
    assert step.seconds(1.0, 1, 1, Draws(0.0)) == pytest.approx(5 * 0.9)
    assert step.seconds(1.0, 1, 1, Draws(0.1)) == pytest.approx(5 * 1.0)
    assert step.seconds(1.0, 1, 1, Draws(0.2)) == pytest.approx(0.9)
    assert step.seconds(1.0, 1, 1, Draws(0.6)) == pytest.approx(1.0)
    assert step.seconds(1.0, 1, 1, Draws(1.0 - 1e-12)) == pytest.approx(1.1)


def test_straggler_rate_and_body_are_what_they_state() -> None:
    step = cost(step_overhead_s=0.0, jitter=0.05, straggler_rate=0.02, straggler_factor=4.0)
    rng = random.Random(11)
    ratios = [step.seconds(1.0, 1, 1, rng) for _ in range(50_000)]
    stragglers = [r for r in ratios if r > 2.0]
    body = [r for r in ratios if r <= 2.0]
    assert len(stragglers) / len(ratios) == pytest.approx(0.02, rel=0.1)
    assert min(body) >= 0.95 and max(body) <= 1.05
    assert min(stragglers) >= 4 * 0.95 and max(stragglers) <= 4 * 1.05
    assert sum(body) / len(body) == pytest.approx(1.0, abs=0.002)


def _token_times(**params: Any) -> list[float]:
    env, _engine, transport = make(**params)
    out: dict[str, Any] = {}
    read_stream(env, transport, {"prompt": "x" * 49, "max_tokens": 300, "stream": True}, out)
    env.run(until=60.0)
    assert out["tokens"] == 300
    times: list[float] = out["times"]
    return times


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_an_engine_adds_the_per_sequence_and_per_token_overhead_to_each_step() -> None:
    plain = _token_times()
    sloped = _token_times(step_overhead_per_seq_s=3e-4, step_overhead_per_token_s=2e-5)
    # the prefill step: one sequence, 50 prompt tokens; each decode step: one, and one token
    assert sloped[0] - plain[0] == pytest.approx(3e-4 + 50 * 2e-5, abs=1e-12)
    for ours, theirs in zip(_gaps(sloped), _gaps(plain), strict=True):
        assert ours - theirs == pytest.approx(3e-4 + 2e-5, abs=1e-12)


def test_an_engine_s_stragglers_take_the_factor_and_nothing_else() -> None:
    plain = _gaps(_token_times())
    assert _gaps(_token_times(straggler_factor=4.0)) == plain  # rate 0: the factor is unused
    slow = _gaps(_token_times(straggler_rate=0.3, straggler_factor=4.0))
    ratios = [ours / theirs for ours, theirs in zip(slow, plain, strict=True)]
    assert all(r == pytest.approx(1.0) or r == pytest.approx(4.0) for r in ratios)
    assert 0.2 < sum(r > 2 for r in ratios) / len(ratios) < 0.4


def _fleet(**fleet: Any) -> Scenario:
    return parse_scenario(merge(BASE, {"fleet": fleet}))


def test_scenario_keys_reach_the_engine_in_seconds() -> None:
    params = _fleet(
        step_overhead_per_seq_us=12.5,
        step_overhead_per_token_us=0.5,
        straggler_rate=0.01,
        straggler_factor=3.0,
    ).fleet.engine_params()
    assert params.step_overhead_s == 0.002
    assert params.step_overhead_per_seq_s == pytest.approx(12.5e-6)
    assert params.step_overhead_per_token_s == pytest.approx(0.5e-6)
    assert (params.straggler_rate, params.straggler_factor) == (0.01, 3.0)


def test_the_linear_timing_takes_step_noise_but_no_jitter_unless_set() -> None:
    linear = {"timing": "linear", "linear": {"decode_s_per_token": 0.01}}
    data = merge(BASE, {"fleet": linear})
    del data["fleet"]["jitter"]  # the base scenario sets it
    params = parse_scenario(data).fleet.engine_params()
    assert (params.jitter, params.straggler_rate, params.step_overhead_s) == (0.0, 0.0, 0.0)
    noisy = _fleet(**linear, jitter=0.1, straggler_rate=0.05, straggler_factor=2.0)
    params = noisy.fleet.engine_params()
    assert (params.jitter, params.straggler_rate, params.straggler_factor) == (0.1, 0.05, 2.0)


@pytest.mark.parametrize(
    ("fleet", "message"),
    [
        ({"step_overhead_per_seq_us": -1.0}, r"fleet\.step_overhead_per_seq_us: .*greater than"),
        ({"step_overhead_per_token_us": -0.1}, r"fleet\.step_overhead_per_token_us: .*greater"),
        ({"straggler_rate": -0.01}, r"fleet\.straggler_rate: .*greater than or equal to 0"),
        ({"straggler_rate": 1.0}, r"fleet\.straggler_rate: .*less than 1"),
        ({"straggler_factor": 0.99}, r"fleet\.straggler_factor: .*greater than or equal to 1"),
    ],
)
def test_bad_step_cost_keys_are_refused_by_name(fleet: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        _fleet(**fleet)


def test_step_cost_keys_at_their_bounds_are_accepted() -> None:
    params = _fleet(straggler_rate=0.0, straggler_factor=1.0, step_overhead_per_seq_us=0.0)
    assert params.fleet.engine_params().straggler_factor == 1.0
    assert _fleet(straggler_rate=0.999999).fleet.straggler_rate == 0.999999
