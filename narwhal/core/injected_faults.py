"""The injected-fault vocabulary: the faults an engine can be made to act out, in either world.

Rule kept here: a fault has one name, and its parameters one set of names, everywhere — in a
scenario's ``[[faults]]`` (the simulator), in ``narwhal emulate --fault`` and the emulator's
``POST /admin/faults``, in the docs and in the parity test — and they are written once, in
:data:`FAULTS`. A world refuses a fault it does not act out with an error that says which world
does, and a name used before the two worlds shared this vocabulary with an error that names its
successor (:data:`RENAMED`, :data:`RENAMED_PARAMETERS`).

Theory of operation: each :class:`InjectedFault` maps the worlds that act it out to the
parameters it takes there (:data:`PARAMETERS` says what each one means); a parameter one world
has no use for is simply not listed for it. When and where a fault strikes is each world's own
business and not part of the vocabulary: a scenario schedules windows on engines (``at_s``,
``rate_per_hour``, ``duration_s``, ``engine``/``role``, ``probability``), the emulator takes the
next requests (``count``, ``phase``). Both parsers call :func:`fault_named` with the kind and
:func:`check_parameters` with the keys they were given before anything else, and build their own
rules on the derived sets (:data:`STREAM_FAULTS`, :data:`PRODUCER_FAULTS`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal


class World(Enum):
    """Where a fault is acted out."""

    SIMULATOR = "simulator"  # a simulated engine, scheduled by a scenario's [[faults]]
    EMULATOR = "emulator"  # an HTTP engine emulator (narwhal emulate --fault, /admin/faults)


SIMULATOR, EMULATOR = World.SIMULATOR, World.EMULATOR

PARAMETERS: Mapping[str, str] = {
    "after_tokens": "tokens the stream delivers before the fault acts (default 0)",
    "factor": "how many times longer each step (simulator) or token (emulator) takes",
    "delay": "seconds added to each token",
    "code": "the HTTP status answered, or the in-band error object's code (default 500)",
    "seconds": "how long a hang or an engine-wide fault lasts (default: until the client "
    "leaves, or until the faults are cleared)",
}
"""Every parameter a fault can take, and what it means."""

ALL_CODES = (100, 599)
SERVER_ERROR_CODES = (500, 599)


@dataclass(frozen=True)
class InjectedFault:
    """One fault an engine can act out: its name, what it does, and where."""

    name: str
    summary: str
    parameters: Mapping[World, tuple[str, ...]]  # the worlds acting it out -> what each takes
    old_names: tuple[str, ...] = ()  # names it had before the vocabulary was shared
    # the one leg of a handoff it can act on: "prefill" (the producer's reply) or "decode"
    leg: Literal["prefill", "decode"] | None = None
    codes: tuple[int, int] = ALL_CODES  # the values ``code`` may take (inclusive)

    @property
    def worlds(self) -> frozenset[World]:
        return frozenset(self.parameters)

    def takes(self, parameter: str, world: World) -> bool:
        return parameter in self.parameters.get(world, ())


def _both(*parameters: str) -> dict[World, tuple[str, ...]]:
    return {SIMULATOR: parameters, EMULATOR: parameters}


FAULTS: tuple[InjectedFault, ...] = (
    InjectedFault(
        "crash",
        "the process dies: connections refused and in-flight requests reset, KV and handoffs "
        "lost; it restarts empty (a new engine id)",
        {SIMULATOR: ()},
    ),
    InjectedFault(
        "hang",
        "/health still answers 200 and streams open (HTTP 200, SSE headers), but no step runs: "
        "nothing is generated and running streams stop until it ends",
        {SIMULATOR: (), EMULATOR: ("seconds",)},
    ),
    InjectedFault(
        "slow",
        "everything is served, but each step (token) takes `factor` times longer "
        "(plus `delay` seconds)",
        {SIMULATOR: ("factor",), EMULATOR: ("factor", "delay")},
    ),
    InjectedFault(
        "stall",
        "a stream goes silent after `after_tokens` tokens; the engine stays healthy",
        {SIMULATOR: ("after_tokens",), EMULATOR: ("after_tokens", "seconds")},
    ),
    InjectedFault(
        "early_done",
        "`data: [DONE]` after `after_tokens` tokens (0: before any token)",
        _both("after_tokens"),
        old_names=("done_first",),
    ),
    InjectedFault(
        "inband_error",
        "HTTP 200, `after_tokens` tokens, then an error object and `[DONE]` (the simulator's "
        "code is 500)",
        {SIMULATOR: ("after_tokens",), EMULATOR: ("after_tokens", "code")},
    ),
    InjectedFault(
        "disconnect",
        "the stream closes after `after_tokens` tokens, before `[DONE]`",
        _both("after_tokens"),
        old_names=("close",),
    ),
    InjectedFault(
        "http_5xx",
        "the request is answered with an HTTP error (`code`, 500 to 599; the simulator's is "
        "500) before anything is streamed",
        {SIMULATOR: (), EMULATOR: ("code",)},
        old_names=("status",),
        codes=SERVER_ERROR_CODES,
    ),
    InjectedFault(
        "refused",
        "connections are refused (the emulator stops listening on its HTTP port)",
        {SIMULATOR: (), EMULATOR: ("seconds",)},
        old_names=("refuse",),
    ),
    InjectedFault(
        "kv_transfer_fail",
        "a KV pull fails (simulator: pulls to or from the engine; emulator: the engine's own "
        "pulls as a consumer), and the consumer follows its kv_load_failure_policy",
        _both(),
        old_names=("kv_fetch_fail",),
        leg="decode",
    ),
    InjectedFault(
        "release_handoff",
        "the producer frees a handoff's blocks at once, so the pull finds nothing",
        _both(),
        old_names=("released_handoff",),
        leg="prefill",
    ),
    InjectedFault(
        "bad_descriptor",
        "the producer's KV descriptor is malformed (simulator: no engine id; emulator: "
        "`remote_block_ids` not a list)",
        _both(),
        leg="prefill",
    ),
    InjectedFault(
        "freeze",
        "every endpoint but /admin hangs, running streams too, like SIGSTOP",
        {EMULATOR: ("seconds",)},
    ),
    InjectedFault("reset", "a TCP reset before any response", {EMULATOR: ()}),
    InjectedFault(
        "hang_headers", "nothing at all is sent, not even a status line", {EMULATOR: ("seconds",)}
    ),
    InjectedFault(
        "hang_first_token", "HTTP 200 and SSE headers, then nothing", {EMULATOR: ("seconds",)}
    ),
)
"""The whole vocabulary (the docs' fault table is this one)."""

BY_NAME: Mapping[str, InjectedFault] = {fault.name: fault for fault in FAULTS}
RENAMED: Mapping[str, str] = {old: f.name for f in FAULTS for old in f.old_names}
"""Old fault name -> its name now."""
RENAMED_PARAMETERS: Mapping[str, str] = {"after": "after_tokens"}
"""Old parameter name (the emulator's) -> its name now."""

STREAM_FAULTS = frozenset(
    f.name for f in FAULTS if any("after_tokens" in taken for taken in f.parameters.values())
)
"""Faults that act on a stream after some tokens (they take ``after_tokens``)."""
PRODUCER_FAULTS = frozenset(f.name for f in FAULTS if f.leg == "prefill")
"""Faults in a producer's prefill reply."""


class FaultNameError(ValueError):
    """A fault name or parameter a world does not take; the message says what to use."""


def names_in(world: World) -> frozenset[str]:
    """The faults ``world`` acts out."""
    return frozenset(f.name for f in FAULTS if world in f.parameters)


def fault_named(name: str, world: World) -> InjectedFault:
    """The fault called ``name``, which ``world`` must act out; else a :class:`FaultNameError`
    that names the new name of an old one, or the world that acts it out."""
    if name in RENAMED:
        raise FaultNameError(f"fault kind {name!r} is now called {RENAMED[name]!r}")
    fault = BY_NAME.get(name)
    if fault is None:
        known = ", ".join(sorted(names_in(world)))
        raise FaultNameError(f"unknown fault kind {name!r}; the {world.value} acts out {known}")
    if world not in fault.parameters:
        (other,) = fault.worlds
        raise FaultNameError(
            f"fault kind {name!r} is acted out by the {other.value} only, not by the {world.value}"
        )
    return fault


def check_parameters(fault: InjectedFault, given: Iterable[str], world: World) -> None:
    """Refuse an old parameter name (naming the new one) and a parameter of the vocabulary
    that ``fault`` does not take in ``world``; keys that are not fault parameters (a world's
    own scheduling keys) are left to the world."""
    for key in given:
        if key in RENAMED_PARAMETERS:
            raise FaultNameError(
                f"fault parameter {key!r} is now called {RENAMED_PARAMETERS[key]!r}"
            )
        if key in PARAMETERS and not fault.takes(key, world):
            takes = ", ".join(fault.parameters[world]) or "no parameters"
            raise FaultNameError(
                f"{key!r} does not apply to {fault.name!r} in the {world.value} (it takes {takes})"
            )


def check_code(fault: InjectedFault, code: int) -> None:
    """Refuse a ``code`` outside the range ``fault`` allows."""
    low, high = fault.codes
    if not low <= code <= high:
        raise FaultNameError(f"{fault.name!r} takes a code from {low} to {high}, got {code}")
