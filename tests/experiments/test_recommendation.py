"""A sweep's recommendation on real (small, seeded) SimPy runs: common random numbers, a
recommendation only for a real difference, recommendation.json, and faults that never ran."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.experiments.figures.base import fault_note
from narwhal.experiments.figures.tuning import colour_range
from narwhal.experiments.plan import build_plan
from narwhal.experiments.recommendation import baseline_of
from narwhal.experiments.spec import SpecError, load_spec, parse_spec
from narwhal.experiments.sweep import run_sweep
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario
from tests.experiments.conftest import TINY_SCENARIO


def _spec(tmp_path: Path, body: str, scenario: str = TINY_SCENARIO) -> Path:
    (tmp_path / "tiny.toml").write_text(scenario, "utf-8")
    path = tmp_path / "spec.toml"
    path.write_text(
        '[sweep]\nname = "t"\nscenario = "tiny.toml"\nseed = 7\nrecipe = "tuning"\n' + body,
        "utf-8",
    )
    return path


def _advice(out: Path) -> dict:
    return json.loads((out / "recommendation.json").read_text("utf-8"))


def _sweep(spec: Path, out: Path) -> int:
    return main(["sweep", str(spec), "--workers", "0", "--no-progress", "--out", str(out)])


def test_replicate_k_of_every_cell_sees_the_same_arrivals_and_faults(tmp_path: Path) -> None:
    spec = load_spec(
        _spec(
            tmp_path,
            'replicates = 2\n[grid]\n"recovery.max_attempts" = [1, 2]\n'
            '"recovery.failure_quarantine_s" = [0.0, 2.0]\n'
            '[figure]\nx = "recovery.max_attempts"\n',
        )
    )
    plan = build_plan(spec)
    seeds = {(t.point, t.replicate): t.seed for t in plan.tasks}
    assert {seeds[(p, 0)] for p in range(4)} != {seeds[(p, 1)] for p in range(4)}
    assert len({seeds[(p, 1)] for p in range(4)}) == 1  # the point is not in the seed
    first, last = (parse_scenario(plan.tasks[i].scenario) for i in (0, -1))
    results = [run(s, seeds[(0, 1)]) for s in (first, last)]
    assert results[0].arrivals == results[1].arrivals  # arrivals and lengths
    assert results[0].fault_windows == results[1].fault_windows
    assert results[0].records != results[1].records  # yet the settings did act differently


def test_a_real_improvement_is_recommended_and_written(tmp_path: Path) -> None:
    # in-band errors on the consumers: a second attempt rescues what one attempt loses
    spec = _spec(
        tmp_path,
        'replicates = 4\n[grid]\n"recovery.max_attempts" = [1, 2]\n'
        '"recovery.eject_after" = [3]\n[tuning]\nprimary = "success_pct"\n'
        'baseline = {"recovery.max_attempts" = 1}\n'
        '[figure]\nx = "recovery.max_attempts"\ny = "recovery.eject_after"\n',
    )
    out = tmp_path / "out"
    assert _sweep(spec, out) == 0
    advice = _advice(out)
    assert advice["recommended"] == {"recovery.max_attempts": 2}
    assert advice["baseline"] == {"recovery.max_attempts": 1}
    assert advice["confidence"] == 0.95 and advice["replicates"] == 4
    gain = advice["cells"][0]["success_pct"]
    assert gain["low"] > 0 and gain["low"] <= gain["difference"] <= gain["high"]
    assert advice["reason"].startswith("max_attempts=2, eject_after=3 beats the baseline")


def test_settings_that_change_nothing_are_not_recommended(tmp_path: Path) -> None:
    # sample_interval_s only watches the run: every cell is the baseline's twin under common
    # random numbers; with seeds by point the cells differ only by noise
    body = (
        'replicates = 3\nseed_by = "{by}"\n[grid]\n"sim.sample_interval_s" = [5.0, 6.0, 7.0]\n'
        '"recovery.eject_after" = [3]\n'
        '[figure]\nx = "sim.sample_interval_s"\ny = "recovery.eject_after"\n'
    )
    for by in ("replicate", "point"):
        out = tmp_path / by
        spec = _spec(tmp_path, body.replace("{by}", by))
        assert _sweep(spec, out) == 0
        advice = _advice(out)
        assert advice["recommended"] is None
        assert advice["baseline"] == {"sim.sample_interval_s": 5.0}  # the scenario's own
        assert advice["reason"].startswith(
            "no setting is distinguishable from the baseline at 3 replicates"
        )
        if by == "replicate":  # identical runs: a difference of exactly 0, nothing to resolve
            assert all(c["slo_attainment_pct"]["difference"] == 0 for c in advice["cells"])
            assert "no cell is better than the baseline on slo_attainment_pct" in advice["reason"]
            assert advice["replicates_needed"] is None
        else:
            assert advice["interval"].startswith("Welch t")


def test_a_baseline_outside_the_grid_gives_no_recommendation(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        'replicates = 2\n[grid]\n"recovery.eject_after" = [1, 2]\n'
        '"recovery.failure_quarantine_s" = [0.0]\n',
    )
    out = tmp_path / "out"
    assert _sweep(spec, out) == 0
    advice = _advice(out)
    assert advice["recommended"] is None and advice["cells"] == []
    assert "is not a cell of the grid" in advice["reason"]
    assert "recovery.eject_after=3" in advice["reason"]


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"baseline": {"recovery.max_attempts": 1}}, "tuning.baseline.recovery.max_attempts: not"),
        ({"baseline": {"recovery.eject_after": 4}}, "4 is not one of the axis' values"),
        ({"primary": "goodput_rps"}, "goodput_rps needs a [goodput] rate axis"),
        ({"primary": "ejections"}, "'ejections' is not a rankable metric"),
        ({"confidence": 1.0}, "tuning.confidence"),
    ],
)
def test_a_bad_tuning_section_is_refused(tuning: dict, message: str) -> None:
    with pytest.raises(SpecError, match="invalid sweep spec") as caught:
        parse_spec({"grid": {"recovery.eject_after": [1, 3]}, "tuning": tuning})
    assert message in str(caught.value)


def test_colour_scales_are_never_narrower_than_the_intervals() -> None:
    assert colour_range([97.6, 97.65], [1.5]) == pytest.approx((94.625, 100.625))
    assert colour_range([10.0, 30.0], [0.5]) == (10.0, 30.0)  # resolved differences: as is
    low, high = colour_range([5.0, 5.0], [])
    assert high > low


def test_a_fault_every_run_ended_before_is_marked_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counted = TINY_SCENARIO.replace("duration_s = 2.0\n", "max_requests = 20\n", 1).replace(
        "at_s = 1.0", "at_s = 120.0"
    )
    spec = _spec(
        tmp_path,
        'replicates = 1\n[grid]\n"recovery.eject_after" = [1, 3]\n'
        '"recovery.failure_quarantine_s" = [0.0]\n',
        counted,
    )
    result = run_sweep(load_spec(spec), workers=0)
    note = fault_note(result)
    assert "hang (decode, at 120s, 1.5s) NOT RUN: every run ended first" in note
    assert "inband_error (decode, 3600/h/engine, 1s p=0.3);" not in note  # rate faults: as is
    assert _sweep(spec, tmp_path / "out") == 0
    err = capsys.readouterr().err
    assert "warning: faults[0] (hang at 120 s) never happened in 2 of 2 runs" in err


def test_with_cases_a_setting_is_judged_by_its_worst_case(tmp_path: Path) -> None:
    # two fault placements as cases, crossed with two retry settings: a setting is a grid cell
    # and each replicate's value is its worst case
    spec = _spec(
        tmp_path,
        'replicates = 3\n[grid]\n"recovery.max_attempts" = [1, 2]\n'
        '[tuning]\nprimary = "success_pct"\n'
        '[[cases]]\nlabel = "as is"\n'
        '[[cases]]\nlabel = "5xx"\nset = { faults = [{ kind = "http_5xx", role = "prefill", '
        "rate_per_hour = 3600.0, duration_s = 1.0, probability = 0.5 }] }\n",
    ).read_text("utf-8")
    path = tmp_path / "cases.toml"
    path.write_text(spec.replace('recipe = "tuning"\n', ""), "utf-8")
    out = tmp_path / "out"
    assert _sweep(path, out) == 0
    advice = _advice(out)
    assert advice["baseline"] == {"recovery.max_attempts": 2}  # the tiny scenario's own
    assert [set(c) - {"better", "worse_on"} for c in advice["cells"]] == [
        {"recovery.max_attempts", "success_pct", "first_byte_p99_s"}
    ]
    runs = list(csv.DictReader((out / "runs.csv").read_text("utf-8").splitlines()))

    def worst(attempts: str, k: int) -> float:
        return min(
            float(r["success_pct"])
            for r in runs
            if r["recovery.max_attempts"] == attempts and r["replicate"] == str(k)
        )

    diffs = [worst("1", k) - worst("2", k) for k in range(3)]
    assert advice["cells"][0]["success_pct"]["difference"] == pytest.approx(sum(diffs) / 3)


def test_a_sweep_of_cases_alone_compares_with_the_case_that_sets_nothing() -> None:
    cases = [{"label": "shipped"}, {"label": "rr", "set": {"routing.prefill": "round_robin"}}]
    plan = build_plan(parse_spec({"cases": cases}))
    assert baseline_of(plan) == ({"case": "shipped"}, "the case that leaves the scenario as it is")
    plain = build_plan(parse_spec({"cases": [{"label": "a"}, {"label": "b"}]}))
    assert baseline_of(plain)[0] is None
    assert "set [tuning] baseline" in baseline_of(plain)[1]
    named = parse_spec(
        {"cases": [{"label": "a"}, {"label": "b"}], "tuning": {"baseline": {"case": "b"}}}
    )
    assert baseline_of(build_plan(named))[0] == {"case": "b"}


def test_a_baseline_case_must_survive_quick() -> None:
    cases = [{"label": "a"}, {"label": "b", "set": {"recovery.max_attempts": 2}}]
    spec = {"cases": cases, "tuning": {"baseline": {"case": "b"}}, "quick": {"cases": ["a"]}}
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert "tuning.baseline.case: 'b' is not in quick.cases" in str(caught.value)
    with pytest.raises(SpecError) as caught:
        parse_spec({**spec, "tuning": {"baseline": {"case": "c"}}, "quick": {}})
    assert "tuning.baseline.case: 'c' is not a case label" in str(caught.value)
