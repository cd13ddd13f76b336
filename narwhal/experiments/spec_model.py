"""The shape of a validated sweep spec: one TOML file says which scenario to vary, how, how often,
and what to draw.

Rule kept here: these models are what a spec *is* once accepted (frozen, unknown keys refused);
how a file becomes one, and every refusal naming its key, is :mod:`narwhal.experiments.spec`.
The figure recipes' checks (:mod:`narwhal.experiments.recipes`) read a spec of this shape, and
the parser runs those checks, so the shape lives below both.

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
- ``[tuning]``: the recommendation's ``baseline`` (grid key -> value; omitted: the scenario's
  own setting), ``primary`` metric (omitted: goodput with ``[goodput]``, else SLO attainment)
  and ``confidence`` (0.95); see :mod:`narwhal.experiments.recommendation`.
- ``[figure]``: the recipe's options (validated by the recipe).
- ``[quick]``: what ``--quick`` replaces (``replicates``, ``base``, ``grid`` axes' values,
  ``cases`` labels kept, ``goodput``) so a test can run the same recipe in seconds.

Besides scenario keys, overrides may use derived keys (:mod:`narwhal.experiments.overrides`):
``fleet.size``, ``fleet.pd_ratio`` and ``workload.rate_multiplier``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SPEC_SECTIONS = ("sweep", "base", "grid", "cases", "goodput", "tuning", "figure", "quick")
# the metrics a recommendation may rank by, and whether higher is better
RANKABLE = {
    "goodput_rps": True,
    "slo_attainment_pct": True,
    "on_time_rps": True,
    "success_pct": True,
    "first_byte_p50_s": False,
    "first_byte_p90_s": False,
    "first_byte_p99_s": False,
    "tpot_p99_s": False,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepSettings(_Strict):
    """``[sweep]``."""

    name: str = "sweep"
    description: str = ""
    scenario: str | None = None  # relative to the spec file; None: the embedded default
    seed: int = 0
    replicates: int = Field(1, ge=1, le=1000)
    seed_by: Literal["point", "replicate"] = "replicate"
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


class TuningSettings(_Strict):
    """``[tuning]``: what a recommendation is measured against and how sure it must be."""

    baseline: dict[str, Any] | None = None  # grid key (or "case") -> value; None: the scenario's
    primary: str | None = None  # a RANKABLE metric; None: goodput_rps, else slo_attainment_pct
    confidence: float = Field(0.95, gt=0.5, lt=1)

    @field_validator("primary")
    @classmethod
    def _rankable(cls, value: str | None) -> str | None:
        if value is not None and value not in RANKABLE:
            raise ValueError(f"{value!r} is not a rankable metric (one of {', '.join(RANKABLE)})")
        return value


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
    tuning: TuningSettings = TuningSettings()
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
