"""The routing policy interface and the policies that need nothing but reservations.

Rule kept here: a policy returns one of the candidates it is given, never another engine, and
draws randomness only from the placement's seeded RNG, so the same seed and the same calls
give the same choices.

Theory of operation: :class:`Placement` builds one policy object per phase and, whenever the
phase has at least one candidate, calls :meth:`RoutingPolicy.choose` with the candidates in
config order, the client request (None when the caller has none) and ``now``. A policy that
learns from placements (an index, a counter) learns from its own choices there; placements made
without it (the quarantine fallback) reach it through :meth:`RoutingPolicy.placed`.

The rules here:
- ``least_reserved`` (the default): the fewest reservations of the phase; ties broken by the RNG.
- ``round_robin``: the next candidate in config order after the engine it chose last (wrapping
  round); no randomness.
- ``random``: uniform over the candidates.
- ``power_of_two``: two distinct candidates drawn at random, the one with fewer reservations
  wins (the first drawn on a tie).
"""

from __future__ import annotations

import random

from narwhal.core.requests import ClientRequest

Counts = dict[str, dict[str, int]]
"""Reservations in flight per engine and phase (``Placement.counts``), read, never written."""


def least_reserved(candidates: list[str], counts: Counts, phase: str, rng: random.Random) -> str:
    """The candidate with the fewest reservations of ``phase``; ties broken by ``rng``."""
    # One pass: the tied engines in config order (no draw when a single engine is least).
    tied: list[str] = []
    least = 0
    for url in candidates:
        load = counts[url][phase]
        if not tied or load < least:
            tied, least = [url], load
        elif load == least:
            tied.append(url)
    return tied[0] if len(tied) == 1 else rng.choice(tied)


class RoutingPolicy:
    """Chooses the engine for one phase among the candidates placement allows."""

    name = ""

    def __init__(self, phase: str, counts: Counts, rng: random.Random) -> None:
        self.phase = phase
        self._counts = counts
        self._rng = rng

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        """One of ``candidates`` (never empty, config order; read, never changed) for
        ``request`` at ``now``."""
        raise NotImplementedError

    def placed(self, url: str, request: ClientRequest | None, now: float) -> None:
        """``url`` got ``request`` without :meth:`choose` (placement's quarantine fallback)."""

    def serving_changed(self, serving: list[str]) -> None:
        """The engines serving the phase are now ``serving`` (a configuration reload)."""


class LeastReserved(RoutingPolicy):
    """The fewest reservations of the phase (today's rule and the default)."""

    name = "least_reserved"

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        return least_reserved(candidates, self._counts, self.phase, self._rng)


class RoundRobin(RoutingPolicy):
    """Each candidate in turn, in config order, skipping engines that are not candidates now."""

    name = "round_robin"

    def __init__(self, phase: str, counts: Counts, rng: random.Random, serving: list[str]) -> None:
        super().__init__(phase, counts, rng)
        self._position = {url: i for i, url in enumerate(serving)}
        self._last = -1  # the config position of the engine chosen last

    def serving_changed(self, serving: list[str]) -> None:
        """New positions; the turn goes on from the first engine after the one chosen last."""
        last = next((url for url, i in self._position.items() if i == self._last), None)
        self._position = {url: i for i, url in enumerate(serving)}
        self._last = self._position.get(last, -1) if last is not None else -1

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        position = self._position
        chosen = candidates[0]  # wrapping round: the first in config order
        for url in candidates:
            if position[url] > self._last:
                chosen = url
                break
        self._last = position[chosen]
        return chosen


class RandomChoice(RoutingPolicy):
    """A candidate drawn uniformly by the seeded RNG."""

    name = "random"

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        return candidates[0] if len(candidates) == 1 else self._rng.choice(candidates)


class PowerOfTwo(RoutingPolicy):
    """Two distinct candidates drawn at random; the one with fewer reservations wins."""

    name = "power_of_two"

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        if len(candidates) == 1:
            return candidates[0]
        first, second = self._rng.sample(candidates, 2)
        phase = self.phase
        if self._counts[second][phase] < self._counts[first][phase]:
            return second
        return first
