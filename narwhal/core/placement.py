"""Placement: which engines may serve each phase, the routing policy that picks one, and the
phase reservations that count load.

Rule kept here: a reservation is taken by :meth:`Placement.reserve` and released exactly once
(release is idempotent and synchronous, so ``finally`` blocks can always run it). Which engines
a policy may pick is decided here, once, for every policy alike.

Theory of operation: for a phase, the candidates are the engines whose role serves it and that
the breaker lets take traffic now (ready: not ejected, probing, quarantined or capped). Engines
this request already failed on are avoided while another candidate exists (Envoy's
``previous_hosts``). The phase's routing policy (:mod:`narwhal.core.routing`, chosen by
``[routing] prefill`` / ``decode``; the default, ``least_reserved``, takes the fewest
reservations of the phase, ties broken by the seeded RNG) picks one of the candidates; every
policy draws from this placement's seeded RNG, so the same seed gives the same placements.
Engine-reported load reaches the policies through :meth:`Placement.report_load`. Whether a
request is prefilled by its consumer instead of a producer
(:mod:`narwhal.core.routing.disagg`) is asked through :meth:`Placement.prefill_locally` and
:attr:`Placement.local_without_producer`, over the consumers this request could be placed on.

Fallback: quarantine steers traffic away from an engine that just failed, and the ejection cap
keeps an engine past ``eject_after`` in service (CAPPED); neither leaves a role without an
engine. When no engine of the phase is ready but some are in service, placement takes, among
those this request has not failed on if there are any, a quarantined engine before a capped one
and the quarantine that ends first before a later one (config order among equals), and logs a
``quarantine_fallback`` decision. Only when every engine of the role is ejected or being probed
is there no placement (the caller answers 503 with Retry-After) — unless the role panics.

Panic (Envoy's panic threshold, ``recovery.panic_threshold_percent``): while fewer than that
share of a phase's engines (members: not joining, not draining) are in service, placement spreads
over every member that no health check has found down, ejected or being probed alike, so a role
of one or two engines never goes dark while an engine could serve. Entering and leaving panic are
logged once each (``panic`` / ``panic_end``, with the phase and the in-service count); the
breaker's state is untouched (an ejected engine still needs its probe to be readmitted).

Fleet changes (a configuration reload, :mod:`narwhal.core.fleet_changes`) reach placement
through :meth:`Placement.serve`: the serving lists become the new fleet's, in its order (a
joining engine is listed, and held out by the breaker until it joins; a draining one is not),
and an engine's counts stay until :meth:`Placement.forget` drops it, once it holds nothing.
Placing a request does no work for this.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Final

from narwhal.core.breaker import Breaker
from narwhal.core.config import Role, RoutingSettings
from narwhal.core.records import DecisionLog
from narwhal.core.requests import ClientRequest
from narwhal.core.routing.build import build_policy
from narwhal.core.routing.disagg import Disaggregation, PrefillRoutes
from narwhal.core.routing.kv_aware import BlockChain
from narwhal.core.routing.kv_index import KvIndex
from narwhal.core.routing.load import EngineLoad, LoadReports
from narwhal.core.routing.policy import RoutingPolicy

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
        self,
        roles: dict[str, Role],
        breaker: Breaker,
        rng: random.Random,
        log: DecisionLog,
        routing: RoutingSettings | None = None,
        block_chain: BlockChain | None = None,
    ) -> None:
        self._breaker = breaker
        self._log = log
        self._panicking = dict.fromkeys(PHASES, False)  # whether each phase panics now
        self.counts: dict[str, dict[str, int]] = {url: dict.fromkeys(PHASES, 0) for url in roles}
        # the engines serving each phase, in config order (changed only by serve())
        self._serving = {
            "prefill": [url for url, role in roles.items() if role.produces],
            "decode": [url for url, role in roles.items() if role.consumes],
        }
        self.load_reports = LoadReports(list(roles))
        settings = routing if routing is not None else RoutingSettings()
        kv = settings.kv_aware
        # what each engine's KV events say it holds (fed by the drivers; read by kv_aware)
        self.kv_index = KvIndex(
            max_blocks_per_engine=kv.max_blocks_per_engine,
            max_blocks_total=kv.max_blocks_total,
            speculative_ttl_s=kv.speculative_ttl_s,
        )
        names = {"prefill": settings.prefill, "decode": settings.decode}
        self.routing: dict[str, RoutingPolicy] = {
            phase: build_policy(
                names[phase],
                phase,
                serving=self._serving[phase],
                counts=self.counts,
                rng=rng,
                reports=self.load_reports,
                settings=settings,
                kv_index=self.kv_index,
                block_chain=block_chain,
            )
            for phase in PHASES
        }
        self.disaggregation = Disaggregation(settings, self.routing["decode"])
        self.local_without_producer = self.disaggregation.local_without_producer
        self.prefill_routes: PrefillRoutes = self.disaggregation.routes

    def serve(self, roles: dict[str, Role]) -> None:
        """The fleet is now ``roles`` (url -> role, in config order): the serving lists become
        its engines (changed in place: the routing policies hold them), and each routing
        policy learns the new lists."""
        for url in roles:
            if url not in self.counts:
                self.counts[url] = dict.fromkeys(PHASES, 0)
        self.load_reports.track(roles)
        self._serving["prefill"][:] = [url for url, role in roles.items() if role.produces]
        self._serving["decode"][:] = [url for url, role in roles.items() if role.consumes]
        for phase, policy in self.routing.items():
            policy.serving_changed(self._serving[phase])

    def held(self, url: str) -> int:
        """Reservations ``url`` holds now, of both phases."""
        return sum(self.counts[url].values())

    def forget(self, url: str) -> None:
        """Drop ``url`` (no longer served, holding nothing), its load reports and its KV index
        entries."""
        del self.counts[url]
        self.load_reports.forget(url)
        self.kv_index.forget(url)

    def candidates(self, phase: str, now: float) -> list[str]:
        breaker = self._breaker
        return [url for url in self._serving[phase] if breaker.placeable(url, now)]

    def any_eligible(self, phase: str, now: float) -> bool:
        """Whether :meth:`choose` would find an engine for ``phase`` now (a ready one, a
        quarantined one to fall back on, or any engine that may serve in panic)."""
        breaker = self._breaker
        # a plain loop, not any() over a generator (which costs more than the loop; every attempt)
        for url in self._serving[phase]:
            if breaker.in_service(url):
                return True
        return bool(self._panic_candidates(phase, now))

    def _panic_candidates(self, phase: str, now: float) -> list[str]:
        """The engines ``phase`` spreads over in panic, or [] when it does not panic now (and
        the log entry when that changes)."""
        breaker = self._breaker
        threshold = breaker.panic_threshold_percent
        if threshold == 0:
            return []
        urls = self._serving[phase]
        serving, joined = breaker.in_service_share(urls)
        panic = 100 * serving < threshold * joined
        members = [url for url in urls if breaker.may_serve_in_panic(url)] if panic else []
        panic = bool(members)
        if panic != self._panicking[phase]:
            self._panicking[phase] = panic
            kind = "panic" if panic else "panic_end"
            self._log.add(now, kind, None, phase=phase, in_service=serving, engines=joined)
        return members

    def falls_back(self, phase: str, now: float) -> bool:
        """Whether ``phase`` has no ready engine but a quarantined one to fall back on."""
        return not self.candidates(phase, now) and self.any_eligible(phase, now)

    def prefill_locally(self, request: ClientRequest, now: float, avoid: Collection[str]) -> bool:
        """Whether ``request``'s uncached prompt is short enough for its consumer to prefill
        (``remote_prefill_min_tokens``; always False when that is 0)."""
        disaggregation = self.disaggregation
        if disaggregation.min_remote_tokens == 0:
            return False
        consumers = self.candidates("decode", now)
        fresh = [url for url in consumers if url not in avoid]
        return disaggregation.short_prompt(request, fresh or consumers, now)

    def report_load(self, url: str, load: EngineLoad, now: float) -> None:
        """``url`` reported ``load`` as of ``now`` (read by ``least_loaded``; see
        :mod:`narwhal.core.routing.load` for when a report stops counting)."""
        self.load_reports.report(url, load, now)

    def choose(
        self,
        phase: str,
        now: float,
        avoid: Collection[str] = (),
        request: ClientRequest | None = None,
    ) -> str | None:
        """The engine for ``phase``, or None when no engine of that role is eligible.

        ``avoid``: engines ``request`` already failed on; ``request``: what the policy may
        read (its prompt, for ``prefix_affinity``; None: a policy that needs it falls back on
        ``least_reserved``)."""
        # (methods called on their objects, not through bound methods: direct calls compiled)
        breaker = self._breaker
        # while every engine of the phase is ready (the common case), the candidates are the
        # serving list itself, not a copy (policies only read it)
        candidates = serving = self._serving[phase]
        for url in serving:
            if not breaker.placeable(url, now):
                candidates = [url for url in serving if breaker.placeable(url, now)]
                break
        if candidates is not serving or self._panicking[phase]:
            panic = self._panic_candidates(phase, now)
            if panic:
                candidates = panic
        if not candidates:
            return self._quarantine_fallback(phase, now, avoid, request)
        if avoid:
            fresh = [url for url in candidates if url not in avoid]
            if fresh:
                candidates = fresh
        return self.routing[phase].choose(candidates, request, now)

    def _quarantine_fallback(
        self, phase: str, now: float, avoid: Collection[str], request: ClientRequest | None
    ) -> str | None:
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
        self.routing[phase].placed(chosen, request, now)
        return chosen

    def reserve(self, url: str, phase: str, now: float, request_id: str) -> Reservation:
        self.counts[url][phase] += 1
        if self._log.enabled:
            self._log.add(now, "place", url, phase=phase, request=request_id)
        return Reservation(url, phase, self._breaker.epoch(url), self)

    def in_flight(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())
