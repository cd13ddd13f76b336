"""A bad sweep spec is refused before anything runs, with every bad key named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from narwhal.cli import main
from narwhal.experiments.plan import build_plan
from narwhal.experiments.spec import SpecError, load_spec, parse_spec
from tests.experiments.conftest import EXPERIMENTS

DIFFUSE_GRID = {"recovery.max_ejection_percent": [50], "recovery.failure_quarantine_s": [0.0]}
TWO_CASES = [{"label": "a"}, {"label": "b"}]


def _refusal(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        build_plan(parse_spec(data, "bad.toml"))
    return str(caught.value)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"swep": {}}, "swep: unknown section"),
        ({"sweep": {"replicate": 2}}, "sweep.replicate: unknown key"),
        ({"sweep": {"replicates": 0}}, "sweep.replicates: Input should be greater than or equal"),
        ({"sweep": {"seed_by": "run"}}, "sweep.seed_by: Input should be 'point' or 'replicate'"),
        ({"sweep": {"recipe": "nope"}}, "sweep.recipe: 'nope' is not a recipe"),
        ({"grid": {"recovry.eject_after": [1]}}, "grid.recovry.eject_after: unknown scenario"),
        ({"grid": {"recovery.eject_after": []}}, "grid.recovery.eject_after: an axis must be"),
        ({"grid": {"recovery.eject_after": [1, 1]}}, "grid.recovery.eject_after: repeated"),
        ({"grid": {"recovery": {"eject_aftr": [1, 2]}}}, "recovery.eject_aftr: unknown key"),
        ({"grid": {"recovery.eject_after": [0, 2]}}, "recovery.eject_after: Input should be"),
        ({"base": {"fleet.prefil": 2}}, "fleet.prefil: unknown key"),
        ({"grid": {"fleet.pd_ratio": ["1-3"]}}, "fleet.pd_ratio: '1-3' is not a ratio"),
        ({"grid": {"fleet.size": [1]}}, "fleet.size: a prefill/decode fleet needs at least 2"),
        (
            {"goodput": {"rate_multipliers": [2.0, 1.0]}},
            "goodput.rate_multipliers: rate multipliers must be strictly increasing",
        ),
        (
            {"goodput": {"rate_multipliers": [1.0, 2.0], "report_at": 3.0}},
            "goodput.report_at: must be one of",
        ),
        (
            {"cases": [{"label": "a"}, {"label": "a"}]},
            "cases[1].label: 'a' is used twice",
        ),
        (
            {"sweep": {"recipe": "tuning"}, "figure": {"x": "recovery.eject_after"}},
            "figure.x: 'recovery.eject_after' is not an axis of [grid]",
        ),
        (
            {"sweep": {"recipe": "tuning"}, "figure": {"colour": "red"}},
            "figure.colour: unknown option of the 'tuning' recipe",
        ),
        ({"sweep": {"recipe": "capacity"}, "grid": {"fleet.size": [4]}}, "goodput: the capacity"),
        ({"figure": {"x": "a"}}, "figure: options given but [sweep].recipe is not set"),
        (
            {"sweep": {"recipe": "diffuse"}, "grid": DIFFUSE_GRID, "cases": [{"label": "a"}]},
            "cases: the diffuse recipe draws at least two fault placements",
        ),
        (
            {
                "sweep": {"recipe": "diffuse"},
                "grid": DIFFUSE_GRID,
                "cases": TWO_CASES,
                "goodput": {"rate_multipliers": [1.0]},
            },
            "goodput: the diffuse recipe reads goodput at one rate",
        ),
        (
            {
                "sweep": {"recipe": "diffuse"},
                "grid": {**DIFFUSE_GRID, "recovery.eject_after": [1, 3]},
                "cases": TWO_CASES,
            },
            "grid: the diffuse recipe draws two axes; also varied: recovery.eject_after",
        ),
        (
            {
                "sweep": {"recipe": "diffuse"},
                "grid": {"recovery.max_ejection_percent": [50]},
                "cases": TWO_CASES,
            },
            "figure.panels: 'recovery.failure_quarantine_s' is not an axis of [grid]",
        ),
        (
            {
                "sweep": {"recipe": "diffuse"},
                "grid": DIFFUSE_GRID,
                "cases": TWO_CASES,
                "figure": {"panels": "recovery.max_ejection_percent"},
            },
            "figure.panels: must differ from figure.lines",
        ),
        (
            {"grid": {"recovery.eject_after": [1, 2]}, "quick": {"grid": {"fleet.size": [2]}}},
            "quick.grid.fleet.size: not an axis of [grid]",
        ),
        (
            {
                "goodput": {"rate_multipliers": [1.0]},
                "quick": {"goodput": {"rate_multipliers": []}},
            },
            "quick.goodput.rate_multipliers:",
        ),
        (
            {
                "goodput": {"rate_multipliers": [1.0, 2.0], "report_at": 2.0},
                "quick": {"goodput": {"rate_multipliers": [0.5, 1.0]}},
            },
            "quick.goodput.report_at: 2 is not one of the quick rate_multipliers",
        ),
        (
            {
                "goodput": {"rate_multipliers": [1.0, 2.0]},
                "quick": {"goodput": {"rate_multipliers": [1.0, 2.0], "report_at": 7.0}},
            },
            "quick.goodput.report_at: 7 is not one of",
        ),
    ],
)
def test_bad_spec_names_the_key(data: dict[str, Any], expected: str) -> None:
    message = _refusal(data)
    assert message.startswith("invalid sweep spec in bad.toml")
    assert expected in message


def test_a_spec_without_a_sweep_table_is_named_after_its_file() -> None:
    assert parse_spec({"grid": {"recovery.eject_after": [1, 2]}}, "dir/mine.toml").sweep.name == (
        "mine"
    )


def test_every_problem_is_reported_at_once() -> None:
    message = _refusal({"sweep": {"replicate": 2}, "grid": {"recovry.x": [1]}, "extra": 1})
    assert "sweep.replicate" in message
    assert "grid.recovry.x" in message
    assert "extra: unknown section" in message


def test_bad_point_names_the_point() -> None:
    message = _refusal({"grid": {"recovery.max_attempts": [1, -1]}})
    assert "point 1 (max_attempts=-1)" in message
    assert "recovery.max_attempts" in message


def test_cli_refuses_a_bad_spec_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('[grid]\n"recovery.eject_aftr" = [1, 2]\n', "utf-8")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "recovery.eject_aftr: unknown key" in err
    assert not (tmp_path / "out").exists()
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read sweep spec" in capsys.readouterr().err
    spec.write_text("[grid\n", "utf-8")
    assert main(["sweep", str(spec)]) == 2
    assert "invalid TOML" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name",
    ["tuning", "retries", "capacity", "capacity-old-model", "diffuse", "routing", "routing-shared",
     "routing-kv-mooncake-4", "routing-kv-mooncake-8", "routing-kv-shared-4",
     "routing-kv-shared-8"],
)  # fmt: skip
def test_shipped_recipes_are_valid_full_and_quick(name: str) -> None:
    spec = load_spec(EXPERIMENTS / f"{name}.toml")
    assert spec.sweep.recipe == name.split("-")[0]
    full, quick = build_plan(spec), build_plan(spec.quick_version())
    assert 0 < len(quick.tasks) <= 8 < len(full.tasks)
