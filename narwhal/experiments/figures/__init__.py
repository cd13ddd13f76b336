"""Figure recipes: named ways to draw a sweep, each a PNG with the CSV of what it draws beside it.

Rule kept here: a recipe reads a finished :class:`~narwhal.experiments.sweep.SweepResult` and
writes files; it never runs simulations. Its options (``[figure]`` in the spec) are a pydantic
model of its own, and its ``check`` states what the spec must contain for it (which axes,
whether ``[goodput]`` is needed), so a spec that cannot be drawn is refused before it runs.

- ``tuning``: heatmaps over two grid axes (success rate, p99 ``first_byte_s``, goodput), the
  recommended cell marked.
- ``retries``: per point, the CDF of ``first_byte_s`` over all requests, and failures stacked
  by error class.
- ``capacity``: goodput against fleet size per prefill:decode ratio, and the attainment curves
  behind it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from pydantic import ValidationError

from narwhal.experiments.figures.base import Recipe

if TYPE_CHECKING:
    from pydantic import BaseModel

    from narwhal.experiments.spec import SweepSpec

RECIPES = {
    "tuning": "narwhal.experiments.figures.tuning",
    "retries": "narwhal.experiments.figures.retries",
    "capacity": "narwhal.experiments.figures.capacity",
}


def load_recipe(name: str) -> Recipe:
    return cast(Recipe, importlib.import_module(RECIPES[name]).RECIPE)


def recipe_options(spec: SweepSpec) -> BaseModel:
    assert spec.sweep.recipe is not None
    return load_recipe(spec.sweep.recipe).options.model_validate(spec.figure)


def check_options(spec: SweepSpec) -> list[str]:
    """Problems (``  key: reason`` lines) with ``[figure]`` and what the recipe needs."""
    assert spec.sweep.recipe is not None
    recipe = load_recipe(spec.sweep.recipe)
    try:
        options = recipe.options.model_validate(spec.figure)
    except ValidationError as error:
        lines = []
        for item in error.errors():
            where = ".".join(str(p) for p in item["loc"])
            reason = item["msg"].removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                reason = f"unknown option of the {recipe.name!r} recipe"
            lines.append(f"  figure.{where}: {reason}")
        return lines
    return [f"  {line}" for line in recipe.check(spec, options)]
