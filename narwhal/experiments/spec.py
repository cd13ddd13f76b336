"""Sweep spec files: read one TOML file and accept it whole, or refuse it naming every bad key.

Rule kept here: a spec is refused as a whole, before anything runs, and every refusal names the
offending key as a dotted path (``grid.recovery.eject_aftr: ...``). Spec keys are validated by
pydantic (the models are :mod:`narwhal.experiments.spec_model`, which documents the sections);
whether an override makes a valid *scenario* is checked by building every point's scenario with
the simulator's own parser (:mod:`narwhal.experiments.plan`).

Theory of operation: :func:`parse_spec` flattens nested override tables into dotted keys,
checks every override key (:func:`narwhal.experiments.overrides.check_key`), validates the
sections into a :class:`~narwhal.experiments.spec_model.SweepSpec`, then checks what pydantic
cannot state field by field (cross-section rules, ``[quick]`` against the full spec, the
recipe's own requirements from :mod:`narwhal.experiments.recipes`), collecting every problem
before raising one :class:`SpecError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from narwhal.config_file import read_toml
from narwhal.core.config import validation_problems
from narwhal.experiments.overrides import check_key, flatten
from narwhal.experiments.recipes import RECIPES, check_options
from narwhal.experiments.spec_model import SPEC_SECTIONS, GoodputSettings, QuickGoodput, SweepSpec


class SpecError(ValueError):
    """A sweep spec was refused; the message names every bad key."""


def _format(error: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    return validation_problems(
        error, prefix=prefix, unknown_key="unknown key (see docs/experiments.md)", model=model
    )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _check_overrides(where: str, mapping: dict[str, Any], problems: list[str]) -> None:
    for key in mapping:
        reason = check_key(key)
        if reason:
            problems.append(f"  {where}.{key}: {reason}")


def _check_axes(where: str, grid: dict[str, Any], problems: list[str]) -> None:
    for key, values in grid.items():
        reason = check_key(key)
        if reason:
            problems.append(f"  {where}.{key}: {reason}")
        elif not isinstance(values, list) or not values:
            problems.append(f"  {where}.{key}: an axis must be a non-empty list of values")
        elif len({_canonical(v) for v in values}) != len(values):
            problems.append(f"  {where}.{key}: repeated values")


def _check_quick_goodput(
    goodput: GoodputSettings, quick: QuickGoodput, problems: list[str]
) -> None:
    """The [goodput] that --quick would run must be as valid as the full one."""
    merged = goodput.model_dump()
    if quick.rate_multipliers is not None:
        merged["rate_multipliers"] = quick.rate_multipliers
    if quick.report_at is not None:
        merged["report_at"] = quick.report_at
    try:
        checked = GoodputSettings.model_validate(merged)
    except ValidationError as error:
        problems.extend(_format(error, GoodputSettings, "quick.goodput"))
        return
    if checked.report_at is not None and checked.report_at not in checked.rate_multipliers:
        problems.append(
            f"  quick.goodput.report_at: {checked.report_at:g} is not one of the quick "
            "rate_multipliers (set quick.goodput.report_at)"
        )


def _check_tuning(spec: SweepSpec, problems: list[str]) -> None:
    """``[tuning]``: a baseline names grid values (or a case label), a primary metric exists."""
    tuning = spec.tuning
    if tuning.primary == "goodput_rps" and spec.goodput is None:
        problems.append("  tuning.primary: goodput_rps needs a [goodput] rate axis")
    for key, value in (tuning.baseline or {}).items():
        if key == "case":
            labels = [case.label for case in spec.cases]
            if value not in labels:
                problems.append(f"  tuning.baseline.case: {value!r} is not a case label")
            elif (
                spec.quick is not None
                and spec.quick.cases is not None
                and value not in spec.quick.cases
            ):
                problems.append(f"  tuning.baseline.case: {value!r} is not in quick.cases")
        elif key not in spec.grid:
            problems.append(f"  tuning.baseline.{key}: not an axis of [grid]")
        elif not any(value == v for v in spec.grid[key]):
            problems.append(f"  tuning.baseline.{key}: {value!r} is not one of the axis' values")
        elif (
            spec.quick is not None
            and key in spec.quick.grid
            and not any(value == v for v in spec.quick.grid[key])
        ):
            problems.append(f"  tuning.baseline.{key}: {value!r} is not one of quick.grid's values")


def _semantics(spec: SweepSpec, problems: list[str]) -> None:
    """Cross-section rules pydantic cannot state field by field."""
    labels = [case.label for case in spec.cases]
    for i, case in enumerate(spec.cases):
        _check_overrides(f"cases[{i}].set", case.set, problems)
        for key in case.set:
            if key in spec.grid:
                problems.append(f"  cases[{i}].set.{key}: also a grid axis; set it in one place")
        if labels.count(case.label) > 1 and labels.index(case.label) != i:
            problems.append(f"  cases[{i}].label: {case.label!r} is used twice")
    goodput = spec.goodput
    if goodput is not None:
        if goodput.report_at is not None and goodput.report_at not in goodput.rate_multipliers:
            problems.append("  goodput.report_at: must be one of goodput.rate_multipliers")
        if "workload.rate_multiplier" in spec.grid:
            problems.append(
                "  grid.workload.rate_multiplier: [goodput] already sweeps the rate; "
                "use one or the other"
            )
    _check_tuning(spec, problems)
    quick = spec.quick
    if quick is not None:
        _check_overrides("quick.base", quick.base, problems)
        _check_axes("quick.grid", quick.grid, problems)
        for key in quick.grid:
            if key not in spec.grid:
                problems.append(f"  quick.grid.{key}: not an axis of [grid]")
        for label in quick.cases or []:
            if label not in labels:
                problems.append(f"  quick.cases: {label!r} is not a case label")
        if quick.goodput is not None and goodput is None:
            problems.append("  quick.goodput: the spec has no [goodput] section")
        elif quick.goodput is not None and goodput is not None:
            _check_quick_goodput(goodput, quick.goodput, problems)
    if spec.sweep.recipe is not None:
        if spec.sweep.recipe not in RECIPES:
            problems.append(
                f"  sweep.recipe: {spec.sweep.recipe!r} is not a recipe ({', '.join(RECIPES)})"
            )
        else:
            problems.extend(check_options(spec))
    elif spec.figure:
        problems.append("  figure: options given but [sweep].recipe is not set")


def parse_spec(data: dict[str, Any], source: str = "<spec>") -> SweepSpec:
    """Validate a mapping (as read from TOML) into a :class:`SweepSpec`."""
    problems: list[str] = []
    for key in sorted(set(data) - set(SPEC_SECTIONS)):
        problems.append(f"  {key}: unknown section (one of {', '.join(SPEC_SECTIONS)})")
    shaped = {k: v for k, v in data.items() if k in SPEC_SECTIONS}
    for key in ("base", "grid"):
        if isinstance(shaped.get(key), dict):
            shaped[key] = flatten(shaped[key], stop_at_lists=key == "grid")
    if isinstance(shaped.get("cases"), list):
        shaped["cases"] = [
            {**c, "set": flatten(c["set"])}
            if isinstance(c, dict) and isinstance(c.get("set"), dict)
            else c
            for c in shaped["cases"]
        ]
    tuning = shaped.get("tuning")
    if isinstance(tuning, dict) and isinstance(tuning.get("baseline"), dict):
        shaped["tuning"] = {**tuning, "baseline": flatten(tuning["baseline"])}
    if isinstance(shaped.get("quick"), dict):
        quick = dict(shaped["quick"])
        for key in ("base", "grid"):
            if isinstance(quick.get(key), dict):
                quick[key] = flatten(quick[key], stop_at_lists=key == "grid")
        shaped["quick"] = quick
    sweep = shaped.get("sweep", {})  # no [sweep] table: every default, the file's stem as name
    if isinstance(sweep, dict) and "name" not in sweep and not source.startswith("<"):
        shaped["sweep"] = {**sweep, "name": Path(source).stem}
    for key, check in (("base", _check_overrides), ("grid", _check_axes)):
        if isinstance(shaped.get(key), dict):
            check(key, shaped[key], problems)
    spec: SweepSpec | None = None
    try:
        spec = SweepSpec.model_validate({**shaped, "source": source})
    except ValidationError as error:
        problems.extend(_format(error, SweepSpec))
    if spec is not None:
        _semantics(spec, problems)
    if problems or spec is None:
        raise SpecError("\n".join([f"invalid sweep spec in {source}:", *problems]))
    return spec


def load_spec(path: str | Path) -> SweepSpec:
    """Read and validate a sweep spec file."""
    return parse_spec(read_toml(path, "sweep spec", SpecError), str(path))
