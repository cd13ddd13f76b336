"""Sweep specs: one TOML file says which scenario to vary, how, how often, and what to draw.

Rule kept here: a spec is refused as a whole, before anything runs, and every refusal names the
offending key as a dotted path (``grid.recovery.eject_aftr: ...``). Spec keys are validated by
pydantic here; whether an override makes a valid *scenario* is checked by building every
point's scenario with the simulator's own parser (:mod:`narwhal.experiments.plan`).

Theory of operation: the sections are

- ``[sweep]``: ``name``, ``description``, ``scenario`` (a scenario TOML path relative to the spec
  file; omitted: the simulator's embedded default), ``seed``, ``replicates``, ``seed_by``
  (``"point"``: every point and replicate draws independently; ``"replicate"``: common random
  numbers, every point of one replicate sees the same arrivals and fault history), ``recipe``.
- ``[base]``: overrides applied to the scenario first (dotted keys, e.g.
  ``"fleet.stream_interval" = 16``; nested tables are read as dotted keys too).
- ``[grid]``: axes, each a dotted key and a non-empty list of values; points are their cartesian
  product (``"recovery.eject_after" = [1, 2, 3, 5]``).
- ``[[cases]]``: a labelled axis of override bundles (``label = "2 attempts"``,
  ``set = {"recovery.max_attempts" = 2, ...}``), crossed with the grid.
- ``[goodput]``: run every point at each of ``rate_multipliers`` (x the point's engine count
  when ``per_engine``) to find DistServe's goodput; ``report_at`` is the multiplier whose runs
  give the point's other metrics.
- ``[figure]``: the recipe's options (validated by the recipe).
- ``[quick]``: what ``--quick`` replaces (``replicates``, ``base``, ``grid`` axes' values,
  ``cases`` labels kept, ``goodput``) so a test can run the same recipe in seconds.

Besides scenario keys, overrides may use derived keys (:mod:`narwhal.experiments.overrides`):
``fleet.size``, ``fleet.pd_ratio`` and ``workload.rate_multiplier``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narwhal.config_file import read_toml
from narwhal.core.config import validation_problems
from narwhal.experiments.overrides import check_key, flatten
from narwhal.experiments.recipes import RECIPES, check_options

SPEC_SECTIONS = ("sweep", "base", "grid", "cases", "goodput", "figure", "quick")


class SpecError(ValueError):
    """A sweep spec was refused; the message names every bad key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepSettings(_Strict):
    """``[sweep]``."""

    name: str = "sweep"
    description: str = ""
    scenario: str | None = None  # relative to the spec file; None: the embedded default
    seed: int = 0
    replicates: int = Field(1, ge=1, le=1000)
    seed_by: Literal["point", "replicate"] = "point"
    recipe: str | None = None


class GoodputSettings(_Strict):
    """``[goodput]``: the inner rate axis that DistServe's goodput needs."""

    rate_multipliers: tuple[float, ...] = Field(min_length=1)
    per_engine: bool = False
    report_at: float | None = None  # None: the lowest multiplier
    attainment_pct: float = Field(90.0, gt=0, le=100)  # DistServe's bar

    @field_validator("rate_multipliers")
    @classmethod
    def _increasing(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(m <= 0 for m in value):
            raise ValueError("every rate multiplier must be > 0")
        if list(value) != sorted(set(value)):
            raise ValueError("rate multipliers must be strictly increasing")
        return value

    def reference(self) -> float:
        return self.rate_multipliers[0] if self.report_at is None else self.report_at


class Case(_Strict):
    """One ``[[cases]]`` entry: a labelled bundle of overrides."""

    label: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)


class QuickGoodput(_Strict):
    rate_multipliers: tuple[float, ...] | None = None
    report_at: float | None = None


class QuickSettings(_Strict):
    """``[quick]``: the shrunken sweep ``--quick`` runs."""

    replicates: int | None = Field(None, ge=1)
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    cases: list[str] | None = None  # labels kept
    goodput: QuickGoodput | None = None


class SweepSpec(_Strict):
    """A validated sweep spec (``source`` is where it was read, for relative paths)."""

    sweep: SweepSettings = SweepSettings()
    base: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    cases: tuple[Case, ...] = ()
    goodput: GoodputSettings | None = None
    figure: dict[str, Any] = Field(default_factory=dict)
    quick: QuickSettings | None = None
    source: str = "<spec>"

    def scenario_path(self) -> Path | None:
        if self.sweep.scenario is None:
            return None
        path = Path(self.sweep.scenario)
        if path.is_absolute() or self.source.startswith("<"):
            return path
        return Path(self.source).parent / path

    def with_seed(self, seed: int | None) -> SweepSpec:
        if seed is None:
            return self
        return self.model_copy(update={"sweep": self.sweep.model_copy(update={"seed": seed})})

    def quick_version(self) -> SweepSpec:
        """The spec with ``[quick]`` applied (unchanged when there is none)."""
        quick = self.quick
        if quick is None:
            return self
        sweep = self.sweep
        if quick.replicates is not None:
            sweep = sweep.model_copy(update={"replicates": quick.replicates})
        grid = {key: quick.grid.get(key, values) for key, values in self.grid.items()}
        cases = self.cases
        if quick.cases is not None:
            cases = tuple(c for c in self.cases if c.label in quick.cases)
        goodput = self.goodput
        if goodput is not None and quick.goodput is not None:
            update: dict[str, Any] = {}
            if quick.goodput.rate_multipliers is not None:
                update["rate_multipliers"] = quick.goodput.rate_multipliers
            if quick.goodput.report_at is not None:
                update["report_at"] = quick.goodput.report_at
            goodput = goodput.model_copy(update=update)
        return self.model_copy(
            update={
                "sweep": sweep,
                "base": {**self.base, **quick.base},
                "grid": grid,
                "cases": cases,
                "goodput": goodput,
                "quick": None,
            }
        )


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
