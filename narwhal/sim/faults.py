"""Faults: engine behaviours switched on and off on a schedule or at random rates.

Rule kept here: a fault is something an *engine* does (crash, hang, run slow, misbehave on some
requests); the router is never told. Whether the router notices, and what it does, is the
core's business. All randomness (which engine, when) comes from the seeded RNG passed in, so a
seed replays the same fault history.

Theory of operation: each ``[[faults]]`` entry of a scenario is a :class:`FaultSpec`. Before the
run, :func:`expand` turns the specs into concrete :class:`FaultWindow` values (engine, kind,
start, end): a scheduled fault (``at_s``) hits ``engine``, or ``count`` engines of ``role``
chosen by the RNG; a rate fault (``rate_per_hour``, per engine) draws Poisson start times over
the horizon for every targeted engine. Windows of one kind on one engine never overlap (a later
one that would is dropped). :func:`install` schedules two SimPy callbacks per window that flip
the engine's switches: crash/restart, hang/resume, slow factor, or a per-request fault that
applies to each request with ``probability`` while the window is open.

Kinds: the simulator's side of the shared vocabulary (:mod:`narwhal.core.injected_faults`,
whose table the docs show): ``crash``, ``hang`` and ``slow`` switch the whole engine, the others
act per request; a kind only the emulator acts out, or an old name, is refused with a message
that says what to use.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import simpy
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from narwhal.core import injected_faults
from narwhal.core.injected_faults import SIMULATOR, check_parameters, fault_named
from narwhal.sim.gpu.engine import SimEngine

KINDS = injected_faults.names_in(SIMULATOR)
ENGINE_FAULTS = frozenset({"crash", "hang", "slow"})  # switch the whole engine
REQUEST_FAULTS = KINDS - ENGINE_FAULTS  # act per request
STREAM_FAULTS = KINDS & injected_faults.STREAM_FAULTS  # act on decode streams
PRODUCER_FAULTS = KINDS & injected_faults.PRODUCER_FAULTS  # prefill replies
FACTOR_FAULTS = frozenset(k for k in KINDS if fault_named(k, SIMULATOR).takes("factor", SIMULATOR))
# the roles whose engines can act a kind out (a prefill-only engine serves no stream, ...)
_ABLE = {"prefill": ("prefill", "both"), "decode": ("decode", "both")}


def able_roles(kind: str) -> tuple[str, ...]:
    """The engine roles on which a fault of ``kind`` does something."""
    if kind in STREAM_FAULTS:
        return _ABLE["decode"]
    if kind in PRODUCER_FAULTS:
        return _ABLE["prefill"]
    return ("prefill", "decode", "both")


class FaultSpec(BaseModel):
    """One ``[[faults]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str  # a kind the simulator acts out (:data:`KINDS`)
    engine: str | None = None  # an engine URL
    role: Literal["prefill", "decode", "both", "any"] | None = None
    count: int = Field(1, ge=1)  # scheduled faults on a role: how many engines (seeded choice)
    at_s: float | None = Field(None, ge=0)
    rate_per_hour: float | None = Field(None, gt=0)  # per targeted engine (Poisson)
    duration_s: float = Field(30.0, gt=0)
    factor: float = Field(3.0, gt=0)  # slow
    probability: float = Field(1.0, gt=0, le=1)  # request faults: share of requests hit
    after_tokens: int = Field(0, ge=0)  # stream faults: tokens sent before the fault

    @model_validator(mode="before")
    @classmethod
    def _vocabulary_keys(cls, data: Any) -> Any:
        """A key of the shared vocabulary that this model has no field for (an emulator
        parameter, an old name) gets the vocabulary's message rather than "extra input"."""
        if isinstance(data, dict) and isinstance(data.get("kind"), str):
            others = [key for key in data if key not in cls.model_fields]
            if others and data["kind"] in KINDS:
                check_parameters(fault_named(data["kind"], SIMULATOR), others, SIMULATOR)
        return data

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        return fault_named(kind, SIMULATOR).name

    @model_validator(mode="after")
    def _one_trigger(self) -> FaultSpec:
        if (self.at_s is None) == (self.rate_per_hour is None):
            raise ValueError("give exactly one of 'at_s' (a schedule) or 'rate_per_hour'")
        if self.engine is not None and self.role is not None:
            raise ValueError("give 'engine' or 'role', not both")
        # a key that would be ignored is refused: the run must be what the file says
        given = self.model_fields_set
        if "factor" in given and self.kind not in FACTOR_FAULTS:
            takers = " or ".join(f'"{kind}"' for kind in sorted(FACTOR_FAULTS))
            raise ValueError(f"'factor' applies to kind = {takers} only")
        if "probability" in given and self.kind in ENGINE_FAULTS:
            raise ValueError(
                f"'probability' applies to per-request kinds; {self.kind!r} switches the whole "
                "engine"
            )
        if "after_tokens" in given and self.kind not in STREAM_FAULTS:
            raise ValueError(
                f"'after_tokens' applies to stream kinds ({', '.join(sorted(STREAM_FAULTS))})"
            )
        if "count" in given and (self.engine is not None or self.at_s is None):
            raise ValueError(
                "'count' is how many engines of 'role' a scheduled fault ('at_s') hits; "
                "a rate fault hits every engine of its role"
            )
        return self


@dataclass(frozen=True)
class FaultWindow:
    """One fault on one engine, from ``start`` to ``end`` (simulated seconds)."""

    url: str
    kind: str
    start: float
    end: float
    factor: float = 1.0
    probability: float = 1.0
    after_tokens: int = 0

    def parameters(self) -> dict[str, object]:
        """The parameters its kind takes, and only those (a hang has none, a slow engine its
        ``factor``, a stall its ``probability`` and ``after_tokens``)."""
        taken: dict[str, object] = {}
        if self.kind in FACTOR_FAULTS:
            taken["factor"] = self.factor
        if self.kind in REQUEST_FAULTS:
            taken["probability"] = self.probability
        if self.kind in STREAM_FAULTS:
            taken["after_tokens"] = self.after_tokens
        return taken

    def as_dict(self) -> dict[str, object]:
        """The window as ``faults.csv`` records it (parameters its kind does not take absent)."""
        return {
            "engine": self.url,
            "kind": self.kind,
            "start": self.start,
            "end": self.end,
            **self.parameters(),
        }


def targets(spec: FaultSpec, roles: dict[str, str]) -> list[str]:
    """The engines ``spec`` may hit (URL -> role in ``roles``); a ValueError says why none.

    ``role = "any"`` (the default) means every engine that can act the kind out.
    """
    able = able_roles(spec.kind)
    if spec.engine is not None:
        role = roles.get(spec.engine)
        if role is None:
            raise ValueError(
                f"engine {spec.engine!r} is not in the fleet (its engines: {', '.join(roles)})"
            )
        if role not in able:
            raise ValueError(
                f"{spec.kind!r} does nothing on {spec.engine} (role {role}); it needs an engine "
                f"of role {' or '.join(able)}"
            )
        return [spec.engine]
    wanted = spec.role or "any"
    if wanted != "any" and wanted not in able:
        raise ValueError(f"{spec.kind!r} does nothing on role {wanted!r}; use {' or '.join(able)}")
    found = [url for url, r in roles.items() if r in able and wanted in ("any", r)]
    if not found:
        raise ValueError(f"no engine of role {wanted!r} in the fleet can act out {spec.kind!r}")
    if spec.at_s is not None and spec.count > len(found):
        raise ValueError(f"count = {spec.count}, but the fleet has {len(found)} such engines")
    return found


def past_the_end(specs: list[FaultSpec], end_s: float) -> list[FaultSpec]:
    """The scheduled faults (``at_s``) that start at or after ``end_s``: in a run that ended
    then, they never happened (rate faults are drawn over a horizon, and their draws past the
    end are simply the future the run did not reach)."""
    return [spec for spec in specs if spec.at_s is not None and spec.at_s >= end_s]


def describe(spec: FaultSpec) -> str:
    """A fault entry in a few words, for warnings: ``crash on http://sim-d0 at 300 s``."""
    target = spec.engine or f"{spec.count} {spec.role or 'any'} engine(s)"
    when = f"at {spec.at_s:g} s" if spec.at_s is not None else f"{spec.rate_per_hour:g}/h"
    return f"{spec.kind} on {target} {when}"


def expand(
    specs: list[FaultSpec], roles: dict[str, str], horizon_s: float, rng: random.Random
) -> list[FaultWindow]:
    """Concrete fault windows for one run, sorted by start time."""
    windows: list[FaultWindow] = []
    for spec in specs:
        hit = targets(spec, roles)

        def make(url: str, start: float, spec: FaultSpec = spec) -> FaultWindow:
            return FaultWindow(
                url,
                spec.kind,
                start,
                start + spec.duration_s,
                spec.factor,
                spec.probability,
                spec.after_tokens,
            )

        if spec.at_s is not None:
            chosen = hit if spec.engine else rng.sample(hit, spec.count)
            for url in chosen:
                windows.append(make(url, spec.at_s))
            continue
        assert spec.rate_per_hour is not None
        rate = spec.rate_per_hour / 3600.0
        for url in hit:
            t = rng.expovariate(rate)
            while t < horizon_s:
                windows.append(make(url, t))
                t += spec.duration_s + rng.expovariate(rate)
    windows.sort(key=lambda w: (w.start, w.url, w.kind))
    kept: list[FaultWindow] = []
    busy_until: dict[tuple[str, str], float] = {}
    for window in windows:
        key = (window.url, window.kind)
        if window.start < busy_until.get(key, -1.0):
            continue
        busy_until[key] = window.end
        kept.append(window)
    return kept


def _begin(engine: SimEngine, w: FaultWindow) -> None:
    if w.kind == "crash":
        engine.crash()
    elif w.kind == "hang":
        engine.set_hung(True)
    elif w.kind == "slow":
        engine.set_slow(w.factor)
    else:
        engine.add_request_fault(w.kind, w.probability, w.after_tokens)


def _end(engine: SimEngine, w: FaultWindow) -> None:
    if w.kind == "crash":
        engine.restart()
    elif w.kind == "hang":
        engine.set_hung(False)
    elif w.kind == "slow":
        engine.set_slow(1.0)
    else:
        engine.remove_request_fault(w.kind, w.probability, w.after_tokens)


def install(
    env: simpy.Environment, engines: dict[str, SimEngine], windows: list[FaultWindow]
) -> None:
    """Schedule every window's start and end on ``env``."""
    for window in windows:
        engine = engines[window.url]
        _at(env, window.start, _begin, engine, window)
        _at(env, window.end, _end, engine, window)


def _at(
    env: simpy.Environment,
    t: float,
    action: Callable[[SimEngine, FaultWindow], None],
    engine: SimEngine,
    window: FaultWindow,
) -> None:
    def fire(_event: object) -> None:
        action(engine, window)

    env.timeout(max(0.0, t - env.now)).callbacks.append(fire)
