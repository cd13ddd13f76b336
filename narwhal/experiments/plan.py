"""The plan: a spec expanded into points and runs, every run with its own derived seed.

Rule kept here: a run's seed is a function of (spec seed, point, replicate) only, never of its
position in the plan, the backend or the worker: ``blake2b("narwhal-sweep/1|seed|point|r")``
truncated to 63 bits, where *point* is the canonical JSON of the point's parameters (sorted
keys). Adding a value to an axis therefore leaves every other point's seed unchanged. With
``seed_by = "replicate"`` (the default) the point is left out: common random numbers, in one
replicate every point sees the same arrivals, lengths and fault history (the simulator splits
the seed into independent workload, fault, engine and router streams, and draws the arrivals
and the fault windows before the run starts, so nothing a setting changes can shift them), and
settings are compared pairwise, replicate by replicate.
The inner rate axis of ``[goodput]`` shares its point's seed for the same reason.

Theory of operation: the base scenario mapping (a TOML file or the simulator's embedded
default) gets ``[base]``; points are the cartesian product of the ``[grid]`` axes (in the spec's
order) crossed with the ``[[cases]]``; each point gets its overrides, its derived keys resolved
(:mod:`narwhal.experiments.overrides`) and, per rate multiplier, its rate scaled. Every distinct
scenario is parsed by the simulator before anything runs, so a bad override fails the whole
sweep up front, naming the point and the key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from narwhal.config_file import parse_toml
from narwhal.experiments.overrides import apply, resolve, scale_rate
from narwhal.experiments.spec import SpecError
from narwhal.experiments.spec_model import Case, SweepSpec
from narwhal.sim.scenario import ScenarioError, default_scenario_text, parse_scenario

SEED_DOMAIN = "narwhal-sweep/1"
CASE_KEY = "case"


def canonical(params: Mapping[str, Any]) -> str:
    """The point's identity: its parameters as canonical JSON."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"))


def derive_seed(
    spec_seed: int, params: Mapping[str, Any], replicate: int, by: str = "point"
) -> int:
    """The seed of one run (see the module's rule)."""
    point = canonical(params) if by == "point" else "*"
    text = f"{SEED_DOMAIN}|{spec_seed}|{point}|{replicate}"
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class Point:
    """One cell of the grid (x one case)."""

    index: int
    params: dict[str, Any]  # axis key -> value, then "case" -> label

    def label(self) -> str:
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in self.params.items())


@dataclass(frozen=True)
class RunTask:
    """One simulation to run: everything a worker needs, picklable, no paths."""

    index: int
    point: int
    replicate: int
    rate_multiplier: float | None
    seed: int
    scenario: dict[str, Any]  # a resolved scenario mapping, as read from TOML
    samples: bool = False  # also return every request's first_byte_s


@dataclass(frozen=True)
class Plan:
    spec: SweepSpec
    points: list[Point]
    tasks: list[RunTask]
    engines: dict[int, dict[str, int]] = field(default_factory=dict)  # point -> fleet counts
    base: dict[str, Any] = field(default_factory=dict)  # the scenario mapping with [base] applied


def base_scenario(spec: SweepSpec) -> dict[str, Any]:
    """The spec's scenario mapping with ``[base]`` applied."""
    path = spec.scenario_path()
    if path is None:
        text, where = default_scenario_text(), "the embedded default scenario"
    else:
        where = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise SpecError(
                f"invalid sweep spec in {spec.source}:\n"
                f"  sweep.scenario: cannot read {path}: {error.strerror or error}"
            ) from None
    data = parse_toml(text, where, SpecError)
    try:
        return apply(data, spec.base)
    except ValueError as error:
        raise SpecError(f"invalid sweep spec in {spec.source}:\n  base.{error}") from None


def expand_points(spec: SweepSpec) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(parameters, overrides) for every point, in plan order."""
    axes = list(spec.grid.items())
    combos = list(itertools.product(*[values for _, values in axes])) if axes else [()]
    cases: list[Case | None] = [*spec.cases] or [None]
    out = []
    for combo in combos:
        for case in cases:
            params = {key: value for (key, _), value in zip(axes, combo, strict=True)}
            overrides = dict(params)
            if case is not None:
                params[CASE_KEY] = case.label
                overrides.update(case.set)
            out.append((params, overrides))
    return out


def _refuse(spec: SweepSpec, point: Point, detail: str) -> SpecError:
    lines = detail.splitlines()
    body = lines[1:] if lines and lines[0].startswith("invalid scenario") else lines
    body = [line if line.startswith("  ") else f"  {line}" for line in body]
    return SpecError(
        "\n".join(
            [f"invalid sweep spec in {spec.source}: point {point.index} ({point.label()}):", *body]
        )
    )


def build_plan(spec: SweepSpec, *, samples: bool = False) -> Plan:
    """Expand ``spec`` into runs, validating every scenario it makes."""
    base = base_scenario(spec)
    goodput = spec.goodput
    multipliers: list[float | None] = (
        list(goodput.rate_multipliers) if goodput is not None else [None]
    )
    points: list[Point] = []
    tasks: list[RunTask] = []
    engines: dict[int, dict[str, int]] = {}
    for index, (params, overrides) in enumerate(expand_points(spec)):
        point = Point(index, params)
        points.append(point)
        try:  # the point's scenario is validated before anything is read from it
            data = resolve(apply(base, overrides))
            parsed = parse_scenario(data, f"point {index}")
        except (ScenarioError, ValueError) as error:
            raise _refuse(spec, point, str(error)) from None
        engines[index] = {
            "engines": len(parsed.router.engines),
            **{role: int(getattr(parsed.fleet, role)) for role in ("prefill", "decode", "both")},
        }
        variants: list[tuple[float | None, dict[str, Any]]] = []
        for multiplier in multipliers:
            scenario = data
            if multiplier is not None:
                scenario = copy.deepcopy(data)
                assert goodput is not None
                factor = multiplier * (len(parsed.router.engines) if goodput.per_engine else 1)
                try:
                    scale_rate(scenario, factor)
                    parse_scenario(scenario, f"point {index}")
                except (ScenarioError, ValueError) as error:
                    raise _refuse(spec, point, str(error)) from None
            variants.append((multiplier, scenario))
        for replicate in range(spec.sweep.replicates):
            seed = derive_seed(spec.sweep.seed, params, replicate, spec.sweep.seed_by)
            for multiplier, scenario in variants:
                tasks.append(
                    RunTask(len(tasks), index, replicate, multiplier, seed, scenario, samples)
                )
    return Plan(spec, points, tasks, engines, base)
