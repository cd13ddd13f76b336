"""The figure recipes as a sweep spec sees them: each recipe's name, its ``[figure]`` options
and what it needs of the spec.

Rule kept here: a spec that cannot be drawn is refused before anything runs, every refusal
naming the key (``figure.x: ...``, ``goodput: ...``). Validating a spec therefore needs each
recipe's options and requirements, but never how it draws: the drawing is
:mod:`narwhal.experiments.figures`, which takes its options from here, so the spec layer does
not depend on the presentation layer.

Theory of operation: :data:`RECIPES` maps each name to a :class:`RecipeRules` (the pydantic
model of its ``[figure]`` options, whether its runs must return every request's
``first_byte_s``, and a ``check`` listing what the spec lacks for it). What each recipe
requires:

- ``tuning``: exactly two varied grid axes, ``figure.x`` and ``figure.y``, and no cases;
- ``retries``: settings compared at one rate, so no ``[goodput]``; its runs return samples
  (the CDF of ``first_byte_s``);
- ``capacity``: the ``figure.size`` and ``figure.ratio`` grid axes and a ``[goodput]`` rate
  axis;
- ``diffuse``: at least two ``[[cases]]`` (where the faults are, from one bad engine to every
  engine a little flaky, in the order drawn), exactly two varied grid axes, ``figure.lines``
  and ``figure.panels``, and no ``[goodput]`` (its goodput is the on-time rate at the one
  offered rate: DistServe's cannot rank settings once faults keep every rate under its bar);
- ``routing``: at least two ``[[cases]]`` (one routing policy setting each, drawn as one line
  each), one of them labelled ``figure.default`` and leaving ``[routing]`` at the core's
  defaults, a ``[goodput]`` rate axis, and no varied grid axis;
- ``flow``: at least two ``[[cases]]`` (admission settings compared, drawn as one line each),
  one of them labelled ``figure.baseline`` and leaving flow control off (the plain
  admission), one varied grid axis ``figure.x`` (the offered load), and no ``[goodput]`` (each
  class's goodput is its on-time rate at each load). Its per-class panels need a scenario with
  ``[[workload.classes]]``, checked when the runs are drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from narwhal.core.config import RoutingSettings
from narwhal.experiments.spec_model import SweepSpec


class Options(BaseModel):
    """A recipe's ``[figure]`` options: unknown keys refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TuningOptions(Options):
    x: str = "recovery.eject_after"
    y: str = "recovery.failure_quarantine_s"


class RetriesOptions(Options):
    x_max_s: float | None = Field(None, gt=0)  # right end of the CDF's x axis


class CapacityOptions(Options):
    size: str = "fleet.size"
    ratio: str = "fleet.pd_ratio"


class DiffuseOptions(Options):
    lines: str = "recovery.max_ejection_percent"  # one line per value
    panels: str = "recovery.failure_quarantine_s"  # one column of panels per value


class RoutingOptions(Options):
    default: str = "least_reserved"  # the label of the case that runs the shipped defaults


class FlowOptions(Options):
    x: str = "workload.rate_multiplier"  # the offered load axis
    baseline: str = "plain admission"  # the label of the case with flow control off


def _missing_axes(spec: SweepSpec, options: Options, axes: tuple[str, ...]) -> list[str]:
    problems = []
    for axis in axes:
        key = getattr(options, axis)
        if key not in spec.grid:
            problems.append(f"figure.{axis}: {key!r} is not an axis of [grid]")
    return problems


def check_tuning(spec: SweepSpec, options: TuningOptions) -> list[str]:
    problems = _missing_axes(spec, options, ("x", "y"))
    if options.x == options.y:
        problems.append("figure.y: must differ from figure.x")
    extra = [k for k, v in spec.grid.items() if k not in (options.x, options.y) and len(v) > 1]
    if extra:
        problems.append(f"grid: the tuning recipe draws two axes; also varied: {', '.join(extra)}")
    if len(spec.cases) > 1:
        problems.append("cases: the tuning recipe draws a grid, not cases")
    return problems


def check_retries(spec: SweepSpec, options: RetriesOptions) -> list[str]:
    if spec.goodput is not None:
        return ["goodput: the retries recipe compares settings at one rate; drop [goodput]"]
    return []


def check_capacity(spec: SweepSpec, options: CapacityOptions) -> list[str]:
    problems = _missing_axes(spec, options, ("size", "ratio"))
    if spec.goodput is None:
        problems.append("goodput: the capacity recipe needs a [goodput] rate axis")
    return problems


def check_diffuse(spec: SweepSpec, options: DiffuseOptions) -> list[str]:
    problems = _missing_axes(spec, options, ("lines", "panels"))
    if options.lines == options.panels:
        problems.append("figure.panels: must differ from figure.lines")
    extra = [
        k for k, v in spec.grid.items() if k not in (options.lines, options.panels) and len(v) > 1
    ]
    if extra:
        problems.append(f"grid: the diffuse recipe draws two axes; also varied: {', '.join(extra)}")
    if len(spec.cases) < 2:
        problems.append("cases: the diffuse recipe draws at least two fault placements as cases")
    if spec.goodput is not None:
        problems.append("goodput: the diffuse recipe reads goodput at one rate; drop [goodput]")
    return problems


def _shipped_routing(key: str) -> Any:
    """The core's default for a dotted ``routing.x[.y]`` key (None for no such key)."""
    node: Any = RoutingSettings().model_dump()
    for part in key.split(".")[1:]:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_routing(spec: SweepSpec, options: RoutingOptions) -> list[str]:
    problems = []
    if len(spec.cases) < 2:
        problems.append("cases: the routing recipe compares at least two policies as cases")
    labels = [case.label for case in spec.cases]
    if options.default not in labels:
        problems.append(f"figure.default: {options.default!r} is not a case label")
    else:
        case = spec.cases[labels.index(options.default)]
        for key, value in case.set.items():
            if key.startswith("routing."):
                shipped = _shipped_routing(key)
                if shipped != value:
                    problems.append(
                        f"figure.default: case {options.default!r} sets {key} = {value!r}, "
                        f"not the shipped default {shipped!r}"
                    )
    varied = [k for k, v in spec.grid.items() if len(v) > 1]
    if varied:
        problems.append(
            f"grid: the routing recipe draws one line per case; varied: {', '.join(varied)}"
        )
    if spec.goodput is None:
        problems.append("goodput: the routing recipe needs a [goodput] rate axis")
    return problems


def check_flow(spec: SweepSpec, options: FlowOptions) -> list[str]:
    problems = _missing_axes(spec, options, ("x",))
    extra = [k for k, v in spec.grid.items() if k != options.x and len(v) > 1]
    if extra:
        problems.append(
            f"grid: the flow recipe draws one load axis; also varied: {', '.join(extra)}"
        )
    if len(spec.cases) < 2:
        problems.append("cases: the flow recipe compares at least two admission settings as cases")
    labels = [case.label for case in spec.cases]
    if options.baseline not in labels:
        problems.append(f"figure.baseline: {options.baseline!r} is not a case label")
    else:
        case = spec.cases[labels.index(options.baseline)]
        if case.set.get("flow.enabled", False) is not False:
            problems.append(
                f"figure.baseline: case {options.baseline!r} must leave flow control off "
                "(flow.enabled = false: plain admission)"
            )
    if spec.goodput is not None:
        problems.append("goodput: the flow recipe reads each class's on-time rate; drop [goodput]")
    return problems


@dataclass(frozen=True)
class RecipeRules:
    """What one recipe asks of a spec."""

    name: str
    options: type[Options]
    needs_samples: bool  # the workers return every request's first_byte_s
    check: Callable[[SweepSpec, Any], list[str]]  # "key: reason" problems


RECIPES = {
    rules.name: rules
    for rules in (
        RecipeRules("tuning", TuningOptions, False, check_tuning),
        RecipeRules("retries", RetriesOptions, True, check_retries),
        RecipeRules("capacity", CapacityOptions, False, check_capacity),
        RecipeRules("diffuse", DiffuseOptions, False, check_diffuse),
        RecipeRules("routing", RoutingOptions, False, check_routing),
        RecipeRules("flow", FlowOptions, False, check_flow),
    )
}


def recipe_options(spec: SweepSpec) -> Options:
    """The spec's ``[figure]`` as its recipe's options (the spec was validated: they are)."""
    assert spec.sweep.recipe is not None
    return RECIPES[spec.sweep.recipe].options.model_validate(spec.figure)


def check_options(spec: SweepSpec) -> list[str]:
    """Problems (``  key: reason`` lines) with ``[figure]`` and what the recipe needs."""
    assert spec.sweep.recipe is not None
    rules = RECIPES[spec.sweep.recipe]
    try:
        options = rules.options.model_validate(spec.figure)
    except ValidationError as error:
        lines = []
        for item in error.errors():
            where = ".".join(str(p) for p in item["loc"])
            reason = item["msg"].removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                reason = f"unknown option of the {rules.name!r} recipe"
            lines.append(f"  figure.{where}: {reason}")
        return lines
    return [f"  {line}" for line in rules.check(spec, options)]
