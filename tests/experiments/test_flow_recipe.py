"""What the ``flow`` recipe asks of a spec (its drawing and per-class columns are run in
test_sweep's quick sweeps)."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.experiments.spec import SpecError, load_spec, parse_spec
from tests.experiments.conftest import EXPERIMENTS


def test_the_shipped_spec_compares_flow_control_with_plain_admission() -> None:
    spec = load_spec(EXPERIMENTS / "flow.toml")
    assert spec.sweep.recipe == "flow" and spec.sweep.seed_by == "replicate"
    cases = {case.label: case.set for case in spec.cases}
    assert cases == {
        "plain admission": {"flow.enabled": False},
        "flow control": {"flow.enabled": True},
    }
    loads = spec.grid["workload.rate_multiplier"]
    assert min(loads) == 0.5 and max(loads) == 3.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cases": [{"label": "plain admission"}]}, "cases: the flow recipe compares"),
        ({"figure": {"baseline": "off"}}, "figure.baseline: 'off' is not a case label"),
        (
            {"cases": [{"label": "plain admission", "set": {"flow.enabled": True}},
                       {"label": "flow control", "set": {"flow.enabled": True}}]},
            "figure.baseline: case 'plain admission' must leave flow control off",
        ),
        ({"grid": {"workload.rate_multiplier": [1.0, 2.0], "fleet.decode": [1, 2]}},
         "grid: the flow recipe draws one load axis; also varied: fleet.decode"),
        ({"grid": {"fleet.decode": [1, 2]}},
         "figure.x: 'workload.rate_multiplier' is not an axis of"),
        ({"goodput": {"rate_multipliers": [1.0, 2.0]}}, "goodput: the flow recipe reads"),
        ({"figure": {"colour": "red"}}, "figure.colour: unknown option of the 'flow' recipe"),
    ],
)  # fmt: skip
def test_a_spec_the_recipe_cannot_draw_is_refused_naming_the_key(
    change: dict[str, Any], message: str
) -> None:
    spec: dict[str, Any] = {
        "sweep": {"recipe": "flow"},
        "grid": {"workload.rate_multiplier": [1.0, 2.0]},
        "cases": [
            {"label": "plain admission", "set": {"flow.enabled": False}},
            {"label": "flow control", "set": {"flow.enabled": True}},
        ],
    }
    spec.update(change)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(spec)
