"""Scripted faults of the emulator: what can go wrong, when, and for how many requests.

Rule kept here: a fault is a plain value (:class:`FaultSpec`) parsed from ``--fault KIND:k=v,...``
or from the admin endpoint's JSON, and a request draws at most one fault, the first active one
whose phase matches; a fault with a ``count`` applies to that many requests and then vanishes.

Theory of operation: per-request kinds (:data:`REQUEST_KINDS`) are drawn by
:meth:`FaultBook.take` when an inference request arrives; the phase of a request is ``prefill``
when it carries ``kv_transfer_params.do_remote_decode = true`` and ``decode`` otherwise.
Engine-wide kinds (:data:`ENGINE_KINDS`: ``refuse`` stops listening, ``freeze`` hangs every
endpoint like SIGSTOP) last ``seconds`` or until the faults are cleared.

Kinds and their parameters (``after``: tokens sent first; ``seconds``: hang length, default
until the client leaves; ``code``: HTTP / in-band status; ``factor``/``delay``: slow tokens):
refuse, freeze, reset, status(code=500), hang_headers, hang_first_token, stall(after),
close(after), done_first, inband_error(after, code=500), slow(factor, delay), kv_fetch_fail,
released_handoff, bad_descriptor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

ENGINE_KINDS = frozenset({"refuse", "freeze"})
REQUEST_KINDS = frozenset(
    {
        "reset",
        "status",
        "hang_headers",
        "hang_first_token",
        "stall",
        "close",
        "done_first",
        "inband_error",
        "slow",
        "kv_fetch_fail",
        "released_handoff",
        "bad_descriptor",
    }
)
KINDS = ENGINE_KINDS | REQUEST_KINDS
PHASES = ("any", "prefill", "decode")
# Kinds that only make sense in one phase default to it.
_DEFAULT_PHASE = {
    "kv_fetch_fail": "decode",
    "released_handoff": "prefill",
    "bad_descriptor": "prefill",
}


class FaultError(ValueError):
    """A fault specification that cannot be used; the message says why."""


@dataclass
class FaultSpec:
    """One scripted fault."""

    kind: str
    count: int | None = None  # None: every matching request until cleared
    phase: str = "any"
    after: int = 0
    seconds: float | None = None
    code: int = 500
    factor: float = 1.0
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FaultError(f"unknown fault kind {self.kind!r}; expected one of {sorted(KINDS)}")
        if self.phase == "any" and self.kind in _DEFAULT_PHASE:
            self.phase = _DEFAULT_PHASE[self.kind]
        if self.phase not in PHASES:
            raise FaultError(f"fault phase must be one of {PHASES}, got {self.phase!r}")
        if self.count is not None and self.count < 1:
            raise FaultError(f"fault count must be >= 1, got {self.count}")
        if self.after < 0 or (self.seconds is not None and self.seconds < 0):
            raise FaultError("fault 'after' and 'seconds' must be >= 0")
        if not 100 <= self.code <= 599:
            raise FaultError(f"fault code must be an HTTP status, got {self.code}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> FaultSpec:
        if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
            raise FaultError("a fault is an object with a string 'kind'")
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
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
        if key in ("count", "after", "code") and value is not None:
            out[key] = int(value)
        elif key in ("seconds", "factor", "delay") and value is not None:
            out[key] = float(value)
        else:
            out[key] = value
    return out


def parse_fault(text: str) -> FaultSpec:
    """Parse ``KIND[:key=value,...]``, e.g. ``stall:after=3,count=2``."""
    kind, _, rest = text.strip().partition(":")
    data: dict[str, Any] = {"kind": kind}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise FaultError(f"fault option {item!r} is not key=value")
        data[key.strip()] = value.strip()
    return FaultSpec.from_dict(data)


class FaultBook:
    """The active per-request faults of one emulated engine, in order."""

    def __init__(self) -> None:
        self._faults: list[FaultSpec] = []

    def add(self, spec: FaultSpec) -> None:
        if spec.kind not in REQUEST_KINDS:
            raise FaultError(f"{spec.kind!r} is an engine-wide fault, not a per-request one")
        self._faults.append(spec)

    def clear(self) -> None:
        self._faults.clear()

    def take(self, phase: str, *, pulling: bool = False) -> FaultSpec | None:
        """The fault for the next request of ``phase`` (its count is consumed), or None.
        A ``kv_fetch_fail`` is only taken by a request that pulls KV (a handoff's decode): a
        plain request would use it up without it ever firing."""
        for spec in self._faults:
            if spec.kind == "kv_fetch_fail" and not pulling:
                continue
            if spec.phase in ("any", phase):
                if spec.count is not None:
                    spec.count -= 1
                    if spec.count == 0:
                        self._faults.remove(spec)
                return spec
        return None

    def snapshot(self) -> list[dict[str, Any]]:
        return [spec.as_dict() for spec in self._faults]
