"""Scripted faults of the emulator: which one, with what parameters, for which requests.

Rule kept here: a fault is a plain value (:class:`FaultSpec`) parsed from ``--fault KIND:k=v,...``
or from the admin endpoint's JSON, named and parameterised as the shared vocabulary
(:mod:`narwhal.core.injected_faults`) says: a fault the emulator does not act out, an old name
or a parameter the fault does not take is refused with a message that says what to use. A
request draws at most one fault, the first active one whose phase matches and whose
``probability`` strikes; a fault with a ``count`` applies to that many requests (that it struck)
and then vanishes.

Theory of operation: per-request faults are drawn by :meth:`FaultBook.take` when an inference
request arrives. The faults that match a request share one uniform draw from the book's seeded
RNG: in order, each takes the next ``probability`` of the unit interval, and a fault of
probability 1 (the default) takes whatever is left. So ``http_5xx:probability=0.02`` then
``stall:probability=0.03`` strike 2% and 3% of the requests (5% in all), and a fault without a
probability strikes every request that reaches it. The phase of a request is ``prefill`` when
it carries ``kv_transfer_params.do_remote_decode = true`` and ``decode`` otherwise, and a fault
that acts on one leg only (the vocabulary's ``leg``) defaults to that phase. Engine-wide faults
(:data:`ENGINE_KINDS`: ``refused`` stops listening, ``freeze`` hangs every endpoint like
SIGSTOP, ``hang`` stops every step while the endpoints still answer) last ``seconds`` or until
the faults are cleared, and take no probability; :mod:`narwhal.emulator.acting` acts them out.
Besides the fault's own parameters a spec takes ``count``, ``phase`` and ``probability``, the
emulator's triggers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from narwhal.core.injected_faults import (
    EMULATOR,
    FaultNameError,
    check_code,
    check_parameters,
    fault_named,
    names_in,
)

KINDS = names_in(EMULATOR)
ENGINE_KINDS = frozenset({"refused", "freeze", "hang"})
REQUEST_KINDS = KINDS - ENGINE_KINDS
PHASES = ("any", "prefill", "decode")
# a spec's keys that are not the fault's parameters
TRIGGERS = ("kind", "count", "phase", "probability")
_INTEGERS = ("count", "after_tokens", "code")
_REALS = ("seconds", "factor", "delay", "probability")


class FaultError(ValueError):
    """A fault specification that cannot be used; the message says why."""


@dataclass
class FaultSpec:
    """One scripted fault (the parameters it does not take keep their defaults)."""

    kind: str
    count: int | None = None  # None: every matching request until cleared
    phase: str = "any"
    probability: float = 1.0  # the share of matching requests it strikes (per-request faults)
    after_tokens: int = 0
    seconds: float | None = None
    code: int = 500
    factor: float = 1.0
    delay: float = 0.0

    def __post_init__(self) -> None:
        try:
            fault = fault_named(self.kind, EMULATOR)
            check_code(fault, self.code)
        except FaultNameError as error:
            raise FaultError(str(error)) from None
        if self.phase == "any" and fault.leg is not None:
            self.phase = fault.leg
        if self.phase not in PHASES:
            raise FaultError(f"fault phase must be one of {PHASES}, got {self.phase!r}")
        if self.count is not None and self.count < 1:
            raise FaultError(f"fault count must be >= 1, got {self.count}")
        if not 0.0 < self.probability <= 1.0:  # (also refuses NaN)
            raise FaultError(f"fault probability must be in (0, 1], got {self.probability}")
        if self.probability < 1.0 and self.kind in ENGINE_KINDS:
            raise FaultError(
                f"{self.kind!r} switches the whole engine; 'probability' applies to "
                "per-request faults"
            )
        if self.after_tokens < 0 or (self.seconds is not None and self.seconds < 0):
            raise FaultError("fault 'after_tokens' and 'seconds' must be >= 0")

    def as_dict(self) -> dict[str, Any]:
        """The triggers and the parameters this fault takes (what :meth:`from_dict` reads)."""
        taken = fault_named(self.kind, EMULATOR).parameters[EMULATOR]
        return {key: getattr(self, key) for key in (*TRIGGERS, *taken)}

    @classmethod
    def from_dict(cls, data: object) -> FaultSpec:
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            raise FaultError("a fault is an object with a string 'kind'")
        try:
            check_parameters(fault_named(data["kind"], EMULATOR), data, EMULATOR)
        except FaultNameError as error:
            raise FaultError(str(error)) from None
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise FaultError(f"unknown fault keys {unknown}")
        try:
            return cls(**_coerce(data))
        except (TypeError, ValueError) as error:
            if isinstance(error, FaultError):
                raise
            raise FaultError(f"bad fault {data!r}: {error}") from None


def _coerce(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _INTEGERS and value is not None:
            out[key] = int(value)
        elif key in _REALS and value is not None:
            out[key] = float(value)
        else:
            out[key] = value
    return out


def parse_fault(text: str) -> FaultSpec:
    """Parse ``KIND[:key=value,...]``, e.g. ``stall:after_tokens=3,count=2``."""
    kind, _, rest = text.strip().partition(":")
    data: dict[str, Any] = {"kind": kind}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise FaultError(f"fault option {item!r} is not key=value")
        data[key.strip()] = value.strip()
    return FaultSpec.from_dict(data)


class FaultBook:
    """The active per-request faults of one emulated engine, in order, and the seeded RNG
    their probabilities are drawn from."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._faults: list[FaultSpec] = []
        self._rng = rng or random.Random(0)

    def add(self, spec: FaultSpec) -> None:
        if spec.kind not in REQUEST_KINDS:
            raise FaultError(f"{spec.kind!r} is an engine-wide fault, not a per-request one")
        self._faults.append(spec)

    def clear(self) -> None:
        self._faults.clear()

    def take(self, phase: str, *, pulling: bool = False) -> FaultSpec | None:
        """The fault for the next request of ``phase`` (its count is consumed), or None.
        A ``kv_transfer_fail`` is only taken by a request that pulls KV (a handoff's decode): a
        plain request would use it up without it ever firing. The matching faults share one
        draw, each striking on its ``probability``'s slice of it (the module's rule)."""
        draw: float | None = None  # drawn once, when the first fault with a probability is met
        edge = 0.0
        for spec in self._faults:
            if spec.kind == "kv_transfer_fail" and not pulling:
                continue
            if spec.phase in ("any", phase):
                if spec.probability < 1.0:
                    if draw is None:
                        draw = self._rng.random()
                    edge += spec.probability
                    if draw >= edge:
                        continue
                if spec.count is not None:
                    spec.count -= 1
                    if spec.count == 0:
                        self._faults.remove(spec)
                return spec
        return None

    def snapshot(self) -> list[dict[str, Any]]:
        return [spec.as_dict() for spec in self._faults]
