"""What the ``routing`` recipe asks of a spec (its recommendation, against the case that leaves
the scenario as it is, is tested in test_recommendation)."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.experiments.spec import SpecError, load_spec, parse_spec
from tests.experiments.conftest import EXPERIMENTS


def test_the_shipped_specs_are_routing_recipes_with_the_core_default() -> None:
    for name in ("routing", "routing-shared"):
        spec = load_spec(EXPERIMENTS / f"{name}.toml")
        assert spec.sweep.recipe == "routing"
        labels = [case.label for case in spec.cases]
        assert labels[0] == spec.figure["default"] == "least_reserved"
        assert {"round_robin", "power_of_two", "least_loaded", "prefix_affinity"} <= set(labels)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cases": [{"label": "least_reserved"}]}, "cases: the routing recipe compares"),
        ({"figure": {"default": "lr"}}, "figure.default: 'lr' is not a case label"),
        (
            {"cases": [{"label": "least_reserved", "set": {"routing.prefill": "random"}},
                       {"label": "rr"}]},
            "figure.default: case 'least_reserved' sets routing.prefill = 'random', not the "
            "shipped default 'least_reserved'",
        ),
        (
            {"cases": [{"label": "least_reserved",
                        "set": {"routing.prefix_affinity.imbalance_threshold": 3}},
                       {"label": "rr"}]},
            "figure.default: case 'least_reserved' sets "
            "routing.prefix_affinity.imbalance_threshold = 3, not the shipped default 2",
        ),
        ({"grid": {"fleet.prefill": [2, 4]}}, "grid: the routing recipe draws one line per case"),
        ({"goodput": None}, "goodput: the routing recipe needs a [goodput] rate axis"),
    ],
)  # fmt: skip
def test_a_spec_the_recipe_cannot_draw_is_refused_naming_the_key(
    change: dict[str, Any], message: str
) -> None:
    spec: dict[str, Any] = {
        "sweep": {"recipe": "routing"},
        "cases": [{"label": "least_reserved"}, {"label": "rr"}],
        "goodput": {"rate_multipliers": [1.0, 2.0]},
    }
    spec.update(change)
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(spec)
