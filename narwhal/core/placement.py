"""Placement: which engine serves each phase, and the phase reservations that count load.

Rule kept here: a reservation is taken by :meth:`Placement.reserve` and released exactly once
(release is idempotent and synchronous, so ``finally`` blocks can always run it); the counters
are the only load signal placement uses.

Theory of operation: for a phase, the candidates are the engines whose role serves it and that
the breaker lets take traffic now (not ejected, probing or quarantined). Engines this request
already failed on are avoided while another candidate exists (Envoy's ``previous_hosts``).
Among candidates the one with the fewest reservations of that phase wins; ties are broken by
the seeded RNG, so the same seed gives the same placements.

Fallback: quarantine steers traffic away from an engine that just failed, and the ejection cap
keeps an engine past ``eject_after`` in service (CAPPED); neither leaves a role without an
engine. When no engine of the phase is ready but some are in service, placement takes, among
those this request has not failed on if there are any, a quarantined engine before a capped one
and the quarantine that ends first before a later one (config order among equals), and logs a
``quarantine_fallback`` decision. Only when every engine of the role is ejected or being probed
is there no placement (the caller answers 503 with Retry-After).
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Final

from narwhal.core.breaker import Breaker
from narwhal.core.config import Role
from narwhal.core.records import DecisionLog

PHASES = ("prefill", "decode")


class Reservation:
    """A prefill or decode slot held on one engine by one attempt, until :meth:`release`."""

    __slots__ = ("_placement", "epoch", "phase", "released", "url")

    def __init__(self, url: str, phase: str, epoch: int, placement: Placement) -> None:
        self.url: Final = url
        self.phase: Final = phase
        self.epoch: Final = epoch  # the engine's breaker epoch when it was placed
        self._placement: Final = placement
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._placement.counts[self.url][self.phase] -= 1


class Placement:
    """Chooses engines and tracks reservations in flight."""

    def __init__(
        self, roles: dict[str, Role], breaker: Breaker, rng: random.Random, log: DecisionLog
    ) -> None:
        self._breaker = breaker
        self._rng = rng
        self._log = log
        self.counts: dict[str, dict[str, int]] = {url: dict.fromkeys(PHASES, 0) for url in roles}
        # the engines serving each phase, in config order (roles are fixed for a router's life)
        self._serving = {
            "prefill": [url for url, role in roles.items() if role.produces],
            "decode": [url for url, role in roles.items() if role.consumes],
        }

    def candidates(self, phase: str, now: float) -> list[str]:
        breaker = self._breaker
        return [url for url in self._serving[phase] if breaker.placeable(url, now)]

    def any_eligible(self, phase: str, now: float) -> bool:
        """Whether :meth:`choose` would find an engine for ``phase`` now (a ready one, or a
        quarantined one to fall back on)."""
        breaker = self._breaker
        return any(breaker.in_service(url) for url in self._serving[phase])

    def falls_back(self, phase: str, now: float) -> bool:
        """Whether ``phase`` has no ready engine but a quarantined one to fall back on."""
        return not self.candidates(phase, now) and self.any_eligible(phase, now)

    def choose(self, phase: str, now: float, avoid: Collection[str] = ()) -> str | None:
        """The engine for ``phase``, or None when no engine of that role is eligible."""
        # One pass: the least loaded eligible engines, in config order, kept apart for engines
        # to avoid, which are chosen only when no other is eligible.
        breaker, counts = self._breaker, self.counts
        tied: list[str] = []
        least = 0
        tied_avoided: list[str] = []
        least_avoided = 0
        for url in self._serving[phase]:
            if not breaker.placeable(url, now):
                continue
            load = counts[url][phase]
            if url not in avoid:
                if not tied or load < least:
                    tied, least = [url], load
                elif load == least:
                    tied.append(url)
            elif not tied_avoided or load < least_avoided:
                tied_avoided, least_avoided = [url], load
            elif load == least_avoided:
                tied_avoided.append(url)
        chosen = tied or tied_avoided
        if not chosen:
            return self._quarantine_fallback(phase, now, avoid)
        return chosen[0] if len(chosen) == 1 else self._rng.choice(chosen)

    def _quarantine_fallback(self, phase: str, now: float, avoid: Collection[str]) -> str | None:
        """No engine of ``phase`` is ready: the fallback rule of the module docstring (None: the
        whole role is out)."""
        breaker = self._breaker
        quarantined = [url for url in self._serving[phase] if breaker.in_service(url)]
        if not quarantined:
            return None
        fresh = [url for url in quarantined if url not in avoid]

        def rank(url: str) -> tuple[bool, float]:
            health = breaker.health(url)
            until = health.quarantined_until
            return health.capped, now if until is None else until

        chosen = min(fresh or quarantined, key=rank)  # min keeps the first among equals
        self._log.add(now, "quarantine_fallback", chosen, phase=phase)
        return chosen

    def reserve(self, url: str, phase: str, now: float, request_id: str) -> Reservation:
        self.counts[url][phase] += 1
        if self._log.enabled:
            self._log.add(now, "place", url, phase=phase, request=request_id)
        return Reservation(url, phase, self._breaker.epoch(url), self)

    def in_flight(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())
