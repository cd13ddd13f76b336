"""Seeds derive from (spec seed, point, replicate) alone; derived keys and goodput follow their
stated rules."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.experiments.aggregate import goodput
from narwhal.experiments.overrides import apply, resolve
from narwhal.experiments.plan import build_plan, derive_seed
from narwhal.experiments.spec import SpecError, parse_spec
from narwhal.sim.shared_context import LLMD_STAGES


def test_seed_is_a_pinned_function_of_seed_point_and_replicate() -> None:
    point = {"recovery.eject_after": 3, "recovery.failure_quarantine_s": 5.0}
    seed = derive_seed(1, point, 0)
    assert seed == derive_seed(1, dict(reversed(point.items())), 0)  # key order is irrelevant
    assert seed == 8282706876165629933  # stable across Python runs and platforms
    assert 0 <= seed < 2**63
    assert len({seed, derive_seed(2, point, 0), derive_seed(1, point, 1)}) == 3
    assert derive_seed(1, {**point, "recovery.eject_after": 2}, 0) != seed
    # common random numbers: the point is left out
    assert derive_seed(1, point, 0, "replicate") == derive_seed(1, {"x": 1}, 0, "replicate")
    assert derive_seed(1, point, 0, "replicate") != derive_seed(1, point, 1, "replicate")


def _seeds(grid: dict[str, list[Any]], **sweep: Any) -> dict[tuple[str, int], int]:
    spec = parse_spec({"sweep": {"replicates": 2, **sweep}, "grid": grid})
    plan = build_plan(spec)
    return {(plan.points[t.point].label(), t.replicate): t.seed for t in plan.tasks}


def test_adding_an_axis_value_keeps_the_other_seeds() -> None:
    small = _seeds({"recovery.eject_after": [1, 3]}, seed_by="point")
    large = _seeds({"recovery.eject_after": [1, 2, 3]}, seed_by="point")
    assert all(large[key] == seed for key, seed in small.items())
    assert len(set(large.values())) == 6
    shared = _seeds({"recovery.eject_after": [1, 2, 3]})  # by replicate, the default
    assert len(set(shared.values())) == 2


def test_goodput_rate_axis_shares_its_points_seed_and_scales_per_engine() -> None:
    spec = parse_spec(
        {
            "sweep": {"seed_by": "point"},
            "grid": {"fleet.size": [8, 12]},
            "goodput": {"rate_multipliers": [0.5, 1.0], "per_engine": True},
        }
    )
    plan = build_plan(spec)
    assert [(t.point, t.rate_multiplier) for t in plan.tasks] == [
        (0, 0.5),
        (0, 1.0),
        (1, 0.5),
        (1, 1.0),
    ]
    assert plan.tasks[0].seed == plan.tasks[1].seed != plan.tasks[2].seed
    scales = [t.scenario["workload"]["rate_scale"] for t in plan.tasks]
    assert scales == [16.0, 32.0, 24.0, 48.0]  # default scenario: rate_scale 4 x m x size
    assert plan.engines[1] == {"engines": 12, "prefill": 6, "decode": 6, "both": 0}


@pytest.mark.parametrize(
    ("size", "ratio", "expected"),
    [(8, "1:3", (2, 6)), (8, "3:1", (6, 2)), (6, "1:3", (2, 4)), (4, "1:1", (2, 2)),
     (3, "1:9", (1, 2)), (3, "9:1", (2, 1)), (None, "1:3", (2, 6))],
)  # fmt: skip
def test_fleet_size_and_ratio_split_prefill_and_decode(
    size: int | None, ratio: str, expected: tuple[int, int]
) -> None:
    overrides: dict[str, Any] = {"fleet.pd_ratio": ratio}
    if size is not None:
        overrides["fleet.size"] = size
    data = resolve(apply({"fleet": {"prefill": 4, "decode": 4}}, overrides))
    assert (data["fleet"]["prefill"], data["fleet"]["decode"]) == expected
    assert "size" not in data["fleet"] and "pd_ratio" not in data["fleet"]


def test_rate_multiplier_scales_trace_or_synthetic_rate() -> None:
    trace = resolve(apply({"workload": {"rate_scale": 4.0}}, {"workload.rate_multiplier": 1.5}))
    assert trace["workload"] == {"rate_scale": 6.0}
    poisson = resolve(
        apply({"workload": {"kind": "poisson", "rate": 10.0}}, {"workload.rate_multiplier": 2})
    )
    assert poisson["workload"] == {"kind": "poisson", "rate": 20.0}


def test_rate_multiplier_compresses_fixed_arrivals() -> None:
    fixed = {"workload": {"kind": "fixed", "arrivals_s": [0.0, 1.0, 3.0]}}
    out = resolve(apply(fixed, {"workload.rate_multiplier": 2.0}))
    assert out["workload"]["arrivals_s"] == [0.0, 0.5, 1.5]  # it used to set an unused rate


def test_rate_multiplier_scales_every_shared_context_stage() -> None:
    given = {"workload": {"kind": "shared_context", "shared_context": {"groups": 3, "stages": [
        {"rate": 10.0, "duration_s": 5.0}, {"rate": 2.0, "duration_s": 1.0}]}}}  # fmt: skip
    out = resolve(apply(given, {"workload.rate_multiplier": 3.0}))
    assert out["workload"]["shared_context"] == {"groups": 3, "stages": [
        {"rate": 30.0, "duration_s": 5.0}, {"rate": 6.0, "duration_s": 1.0}]}  # fmt: skip
    ramp = resolve(apply({"workload": {"kind": "shared_context"}}, {"workload.rate_multiplier": 2}))
    stages = ramp["workload"]["shared_context"]["stages"]
    assert [(s["rate"], s["duration_s"]) for s in stages] == [
        (rate * 2, duration) for rate, duration in LLMD_STAGES
    ]  # the simulator's default ramp, scaled
    with pytest.raises(ValueError, match=r"workload.shared_context.stages.0.rate: must be a"):
        resolve(apply(given, {"workload.shared_context.stages.0.rate": "fast",
                              "workload.rate_multiplier": 2.0}))  # fmt: skip


def test_routing_is_a_scenario_section_overrides_may_set() -> None:
    spec = parse_spec({"cases": [{"label": "rr", "set": {"routing.prefill": "round_robin"}}]})
    plan = build_plan(spec)
    assert plan.tasks[0].scenario["routing"] == {"prefill": "round_robin"}
    with pytest.raises(SpecError, match=r"point 0 \(case=x\):\n  routing.prefill: Input should"):
        build_plan(parse_spec({"cases": [{"label": "x", "set": {"routing.prefill": "best"}}]}))


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ({"fleet": 3}, "fleet"),
        ({"fleet.prefill": "two"}, "fleet.prefill: must be a whole number of engines"),
        ({"workload": 5}, "workload"),
    ],
)
def test_a_malformed_point_is_a_spec_error_naming_its_key(
    base: dict[str, Any], message: str
) -> None:
    spec = parse_spec(
        {"base": base, "grid": {"fleet.size": [4]}, "goodput": {"rate_multipliers": [1.0, 2.0]}}
    )
    with pytest.raises(SpecError, match=message):  # these were tracebacks
        build_plan(spec)


def test_overrides_walk_arrays_and_merge_tables() -> None:
    data = {"faults": [{"kind": "hang", "at_s": 1.0}], "workload": {"prompt": {"value": 3}}}
    out = apply(data, {"faults.0.at_s": 2.0, "workload.prompt": {"dist": "fixed"}})
    assert out == {
        "faults": [{"kind": "hang", "at_s": 2.0}],
        "workload": {"prompt": {"value": 3, "dist": "fixed"}},
    }
    assert data["faults"][0]["at_s"] == 1.0  # the input is not touched
    with pytest.raises(ValueError, match=r"faults\.3: no such array element"):
        apply(data, {"faults.3.at_s": 2.0})


def test_goodput_interpolates_the_90_percent_crossing() -> None:
    assert goodput([(10.0, 99.0), (20.0, 95.0), (30.0, 85.0)]) == (25.0, "")
    assert goodput([(10.0, 99.0), (20.0, 95.0)]) == (20.0, "above")
    assert goodput([(10.0, 80.0), (20.0, 95.0)]) == (0.0, "below")
    # the first miss ends the scan, even if a higher rate passes again (DistServe's "highest
    # rate that meets the bar" read as sustained)
    assert goodput([(10.0, 95.0), (20.0, 85.0), (30.0, 95.0)]) == (15.0, "")
    assert goodput([]) == (0.0, "below")
