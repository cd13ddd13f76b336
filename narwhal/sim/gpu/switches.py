"""An engine's fault switches: what is switched on now, and the per-request draws.

Rule kept here: a fault is engine behaviour, switched on and off from outside
(:mod:`narwhal.sim.faults` schedules the windows); the engine only asks these switches. Every
draw comes from the engine's own seeded RNG, in the order the engine asks, so a run replays.

What each switch makes the engine do:
- ``down`` (crash): connections are refused; the engine lost its KV, sequences and handoffs.
- ``hung`` (hang): no step runs; connections are still accepted and then say nothing.
- ``slow``: every step takes ``slow`` times as long.
- request faults, each with a probability drawn per request and an ``after`` token count:
  ``refused`` (the connection is refused), ``http_5xx`` (a 500 error object), the stream
  faults of :data:`STREAM_FAULTS` (drawn when a stream opens and acted out by
  :class:`~narwhal.sim.gpu.output.StreamWriter` once ``after`` tokens were sent: ``stall`` goes
  silent, ``early_done`` sends ``[DONE]``, ``inband_error`` sends an error event and
  ``[DONE]``, ``disconnect`` closes before ``[DONE]``), ``kv_transfer_fail`` (a KV pull to or
  from the engine fails), ``release_handoff`` (the producer frees a prefill's blocks at once)
  and ``bad_descriptor`` (the producer's descriptor has no engine id).
"""

from __future__ import annotations

import random

STREAM_FAULTS = ("stall", "early_done", "inband_error", "disconnect")


class FaultSwitches:
    """One engine's switches and the per-request draws against them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.down = False
        self.hung = False
        self.slow = 1.0
        self.request_faults: list[tuple[str, float, int]] = []  # (kind, probability, after)

    def refuses(self) -> bool:
        """Whether this connection is refused (the engine is down, or a ``refused`` draw)."""
        if self.down:
            return True
        return any(
            kind == "refused" and (p >= 1.0 or self.rng.random() < p)
            for kind, p, _ in self.request_faults
        )

    def answers_5xx(self) -> bool:
        """Whether this request is answered with a 500 (an ``http_5xx`` draw)."""
        return any(
            kind == "http_5xx" and (p >= 1.0 or self.rng.random() < p)
            for kind, p, _ in self.request_faults
        )

    def draw(self, kinds: tuple[str, ...]) -> tuple[str, int] | None:
        """The first active fault among ``kinds`` that hits this request, with its ``after``."""
        for kind, p, after in self.request_faults:
            if kind in kinds and (p >= 1.0 or self.rng.random() < p):
                return kind, after
        return None

    def has(self, kind: str) -> bool:
        """Whether this request is hit by an active fault of ``kind``."""
        return bool(self.request_faults) and self.draw((kind,)) is not None

    def condition(self) -> str:
        """The engine's own condition, for the state timeline."""
        if self.down:
            return "crashed"
        if self.hung:
            return "hung"
        parts = [f"slow x{self.slow:g}"] if self.slow != 1.0 else []
        parts += sorted({kind for kind, _, _ in self.request_faults})
        return "+".join(parts) if parts else "up"
