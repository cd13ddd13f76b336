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
        assert {"round_robin", "power_of_two", "least_loaded", "prefix_affinity", "kv_aware"} <= (
            set(labels)
        )


def test_the_kv_evidence_specs_share_policies_seeds_and_load_per_engine() -> None:
    """The four routing-kv specs are read together (benchmarks/simulator/kv_routing_evidence.py):
    the same policies and seeds, and a fleet of 8 at twice the 4-engine rates."""
    specs = {
        name: load_spec(EXPERIMENTS / f"routing-kv-{name}.toml")
        for name in ("mooncake-4", "mooncake-8", "shared-4", "shared-8")
    }
    for name, spec in specs.items():
        labels = [case.label for case in spec.cases]
        assert labels == ["least_reserved", "round_robin", "least_loaded", "prefix_affinity",
                          "kv_aware"], name  # fmt: skip
        assert spec.sweep.seed_by == "replicate" and spec.sweep.replicates >= 5
        assert spec.base["fleet.size"] == int(name.split("-")[1])
    for workload in ("mooncake", "shared"):
        small, large = specs[f"{workload}-4"].goodput, specs[f"{workload}-8"].goodput
        assert small is not None and large is not None
        assert [2 * m for m in small.rate_multipliers] == list(large.rate_multipliers)


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
