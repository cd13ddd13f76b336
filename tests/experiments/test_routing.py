"""The ``routing`` recipe's rule: the shipped default stays unless a challenger's goodput beats
it by more than the tolerance while it loses nowhere (attainment, rejections) by more than the
loss tolerance; and what the recipe asks of a spec."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.experiments.figures.routing import recommend
from narwhal.experiments.spec import SpecError, load_spec, parse_spec
from tests.experiments.conftest import EXPERIMENTS

POLICIES = ["least_reserved", "round_robin", "prefix_affinity"]
FLAT = {p: [95.0, 80.0] for p in POLICIES}  # attainment per rate, equal for all
NONE = {p: [0.0, 0.0] for p in POLICIES}  # rejections per rate


def _pick(goodput: dict[str, float], attainment: Any = FLAT, rejected: Any = NONE) -> str:
    return recommend(POLICIES, "least_reserved", goodput, attainment, rejected, 5.0, 1.0)


def test_a_challenger_must_beat_the_default_by_more_than_the_tolerance() -> None:
    assert _pick({"least_reserved": 20.0, "round_robin": 21.0, "prefix_affinity": 10.0}) == (
        "least_reserved"  # exactly 5% better: not more than the tolerance
    )
    assert _pick({"least_reserved": 20.0, "round_robin": 21.01, "prefix_affinity": 10.0}) == (
        "round_robin"
    )
    assert _pick({"least_reserved": 0.0, "round_robin": 0.0, "prefix_affinity": 0.0}) == (
        "least_reserved"  # all below the lowest rate: nothing beats the default
    )


def test_the_best_qualifying_challenger_wins_ties_in_case_order() -> None:
    best = {"least_reserved": 20.0, "round_robin": 30.0, "prefix_affinity": 40.0}
    assert _pick(best) == "prefix_affinity"
    tied = {"least_reserved": 20.0, "round_robin": 30.0, "prefix_affinity": 30.0}
    assert _pick(tied) == "round_robin"


def test_a_loss_past_the_tolerance_at_any_rate_disqualifies() -> None:
    goodput = {"least_reserved": 20.0, "round_robin": 10.0, "prefix_affinity": 40.0}
    at_the_edge = {**FLAT, "prefix_affinity": [95.0, 79.0]}  # exactly 1 pp lower at one rate
    assert _pick(goodput, at_the_edge) == "prefix_affinity"
    past_it = {**FLAT, "prefix_affinity": [95.0, 78.99]}
    assert _pick(goodput, past_it) == "least_reserved"
    rejects_at_the_edge = {**NONE, "prefix_affinity": [0.0, 1.0]}
    assert _pick(goodput, FLAT, rejects_at_the_edge) == "prefix_affinity"
    rejects_more = {**NONE, "prefix_affinity": [1.01, 0.0]}
    assert _pick(goodput, FLAT, rejects_more) == "least_reserved"


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
