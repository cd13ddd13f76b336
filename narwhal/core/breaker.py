"""The breaker: ejection after a failure streak, quarantine, and probe-gated readmission.

Rule kept here: one object holds every engine's health state and changes it only through the
methods below, each taking ``now``; randomness (probe jitter) comes from the injected RNG.
Like Envoy's outlier detector, it is tested at exact time boundaries.

Theory of operation:
- Each engine has a failure streak per phase (its prefill legs, its decode streams). A charged
  failure adds one to its phase's streak; a completed leg of that phase resets it. At
  ``recovery.eject_after`` consecutive failures of either phase the engine is EJECTED: it gets no
  placement until an inference probe succeeds (:meth:`Breaker.on_probe`). Two streaks, so that
  an engine of role ``both`` whose decodes keep failing is ejected although its prefills pass.
- ``recovery.failure_quarantine_s > 0``: any charged failure also excludes the engine from
  placement for that long (QUARANTINED), while the streak catches up. Quarantine only steers
  traffic: when every engine of a role that is not ejected is quarantined, placement still uses
  one (:mod:`narwhal.core.placement`), so quarantine alone never empties a role.
- The ejection cap, ``recovery.max_ejection_percent`` (Envoy's semantics): the breaker ejects
  an engine only while the engines ejected in each role it serves stay within that share of
  the role (rounded down), and one engine of a role may always be ejected. An engine that
  reaches ``eject_after`` over the cap is CAPPED (logged ``eject_capped``): still in service,
  but placement uses it only when no engine of the phase is ready or quarantined — a capped
  engine that fails fast would otherwise hold the fewest reservations and draw the most
  traffic. When another engine is readmitted, the capped engines that now fit under the cap are
  ejected (and so probed). A completed leg that ends its streak frees it. Health checks (an
  engine that is down) are not capped: when a whole role is down, it is ejected whole, and
  probed as a wave (below).
- Results are tagged with the engine's *epoch* at placement. Ejection and readmission bump the
  epoch, so a late result from before an ejection never changes the new state.
- Probes: at most one in flight per engine (PROBING). The cadence is ``probe_interval_s`` with
  jitter and doubling backoff after failed probes, up to ``probe_backoff_cap`` intervals (16).
  An inconclusive probe returns to the normal cadence: the next probe after
  ``probe_interval_s``, the backoff reset.
  When every engine able to serve a role is ejected (a whole wave), all of them are probed
  together, at once, instead of one by one.
- Health checks: a failed check marks an engine down (EJECTED, reason "health"). Without an
  engine contract such an engine is readmitted by a passing check; with one, by a probe that
  also re-validates the contract. Breaker ejections always need an inference probe.
- Fleet changes (a configuration reload, :mod:`narwhal.core.fleet_changes`): an added engine
  is JOINING, held out like an ejected one (reason "joining") and probed at once, with the
  normal cadence and backoff after a failed probe; it counts as a member of its roles (for the
  ejection cap and whole waves) only once a probe passes. A removed engine is DRAINING: no
  longer a member, never probed or health-checked, its failures change nothing (it is leaving);
  it is forgotten once nothing holds it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from narwhal.core.config import RecoverySettings, Role
from narwhal.core.records import DecisionLog

JITTER = 0.25  # probe delays are drawn from [1 - JITTER, 1 + JITTER] x the nominal delay


class EngineState(str, Enum):
    READY = "ready"
    QUARANTINED = "quarantined"
    CAPPED = "capped"  # over eject_after, kept in service by the ejection cap: a last resort
    EJECTED = "ejected"
    PROBING = "probing"
    JOINING = "joining"  # added by a reload, waiting for its first passing probe
    DRAINING = "draining"  # removed by a reload, finishing what it holds


JOINING_REASON = "joining"  # the eject_reason of an engine added by a reload


class ProbeOutcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"  # could not judge the engine (e.g. its producer failed)


@dataclass
class EngineHealth:
    """Mutable health of one engine; read it through :class:`Breaker`."""

    url: str
    role: Role
    prefill_streak: int = 0  # consecutive charged failures of its prefill legs
    decode_streak: int = 0  # consecutive charged failures of its decode streams
    epoch: int = 0
    ejected_since: float | None = None
    eject_reason: str | None = None  # "breaker" | "health"
    quarantined_until: float | None = None
    probing: bool = False
    next_probe_at: float | None = None
    failed_probes: int = 0
    times_ejected: int = 0
    probe_producer: str | None = None  # for a consumer ejected after a crossed decode
    capped: bool = False  # reached eject_after while the ejection cap was reached
    draining: bool = False  # removed by a reload: no placement, forgotten once free
    down: bool = False  # its last health check failed (never placed, even in panic)

    @property
    def streak(self) -> int:
        """The longer of the two failure streaks (what ejection compares to ``eject_after``)."""
        return max(self.prefill_streak, self.decode_streak)


class Breaker:
    """Health state of the whole fleet."""

    def __init__(
        self,
        engines: Iterable[tuple[str, Role]],
        recovery: RecoverySettings,
        rng: random.Random,
        log: DecisionLog,
        *,
        contract_configured: bool = False,
    ) -> None:
        self._engines = {url: EngineHealth(url, role) for url, role in engines}
        self._recovery = recovery
        self._rng = rng
        self._log = log
        self._contract = contract_configured
        self._members = {  # the engines serving each role (changed only by fleet changes, below)
            role: [e for e in self._engines.values() if self._serves(e.role, role)]
            for role in (Role.PREFILL, Role.DECODE)
        }

    # ------------------------------------------------------------------ reading

    def health(self, url: str) -> EngineHealth:
        return self._engines[url]

    @property
    def urls(self) -> list[str]:
        return list(self._engines)

    @property
    def in_fleet(self) -> list[str]:
        """The engines health checks watch: every engine but the draining ones."""
        return [url for url, engine in self._engines.items() if not engine.draining]

    def state(self, url: str, now: float) -> EngineState:
        engine = self._engines[url]
        if engine.draining:
            return EngineState.DRAINING
        if engine.eject_reason == JOINING_REASON:
            return EngineState.JOINING
        if engine.probing:
            return EngineState.PROBING
        if engine.ejected_since is not None:
            return EngineState.EJECTED
        if engine.capped:
            return EngineState.CAPPED
        if engine.quarantined_until is not None and now < engine.quarantined_until:
            return EngineState.QUARANTINED
        return EngineState.READY

    def placeable(self, url: str, now: float) -> bool:
        """True when the engine may receive client traffic now (``state`` is READY)."""
        engine = self._engines[url]
        if engine.probing or engine.ejected_since is not None or engine.capped:
            return False
        until = engine.quarantined_until
        return until is None or now >= until

    def in_service(self, url: str) -> bool:
        """True when the engine may take traffic at all: not ejected, not being probed
        (placement may fall back to a quarantined or capped engine)."""
        engine = self._engines[url]
        return not engine.probing and engine.ejected_since is None

    @property
    def panic_threshold_percent(self) -> int:
        return self._recovery.panic_threshold_percent

    def in_service_share(self, urls: list[str]) -> tuple[int, int]:
        """(engines in service, members) among ``urls``: members are neither joining nor
        draining; in service, not ejected and not being probed (what the panic threshold
        compares)."""
        serving = members = 0
        engines = self._engines
        for url in urls:
            engine = engines[url]
            if engine.draining or engine.eject_reason == JOINING_REASON:
                continue
            members += 1
            if not engine.probing and engine.ejected_since is None:
                serving += 1
        return serving, members

    def may_serve_in_panic(self, url: str) -> bool:
        """True when the engine is a member that no health check has found down (a joining,
        draining or down engine cannot serve even when its role panics)."""
        engine = self._engines[url]
        if engine.draining or engine.eject_reason == JOINING_REASON:
            return False
        return not engine.down

    def epoch(self, url: str) -> int:
        return self._engines[url].epoch

    # ------------------------------------------------------------------ results of traffic

    def on_success(self, url: str, epoch: int, now: float, *, phase: str) -> None:
        """A leg of ``phase`` ("prefill" or "decode") completed on ``url``: that streak resets."""
        engine = self._engines[url]
        if epoch != engine.epoch:
            return
        if phase == "prefill":
            engine.prefill_streak = 0
        else:
            engine.decode_streak = 0
        if engine.capped and engine.streak < self._recovery.eject_after:
            engine.capped = False

    def on_failure(
        self, url: str, epoch: int, now: float, *, phase: str, producer: str | None = None
    ) -> bool:
        """A charged failure of a ``phase`` leg on ``url``; returns True if it ejected the engine.

        ``producer`` names the producer of a crossed decode, so the readmission probe can use a
        fresh handoff from that same producer.
        """
        engine = self._engines.get(url)
        if engine is None or engine.draining:  # leaving (or gone): nothing to decide about it
            return False
        if epoch != engine.epoch or engine.ejected_since is not None:
            self._log.add(now, "stale", url, epoch=epoch)
            return False
        if phase == "prefill":
            engine.prefill_streak += 1
        else:
            engine.decode_streak += 1
        if self._recovery.failure_quarantine_s > 0:
            engine.quarantined_until = now + self._recovery.failure_quarantine_s
            self._log.add(now, "quarantine", url, until=engine.quarantined_until)
        if engine.streak < self._recovery.eject_after:
            return False
        engine.probe_producer = producer
        if self._ejection_capped(engine):
            engine.capped = True
            self._log.add(now, "eject_capped", url, streak=engine.streak)
            return False
        self._eject(engine, now, "breaker")
        return True

    # ------------------------------------------------------------------ health checks

    def on_health(self, url: str, now: float, ok: bool) -> None:
        """Result of a background health check."""
        engine = self._engines.get(url)
        if engine is None or engine.draining:  # forgotten or leaving while it was checked
            return
        engine.down = not ok
        if not ok:
            if engine.ejected_since is None:
                engine.probe_producer = None
                self._eject(engine, now, "health")
            return
        if engine.eject_reason == "health" and not self._contract and not engine.probing:
            self._readmit(engine, now, "health_check")

    # ------------------------------------------------------------------ probes

    def due_probes(self, now: float) -> list[str]:
        """Ejected engines whose probe is due now; each is marked PROBING (one in flight)."""
        wave_roles = {role for role in (Role.PREFILL, Role.DECODE) if self._whole_wave(role)}
        due: list[str] = []
        for engine in self._engines.values():
            if not self._awaits_probe(engine):
                continue  # in service, being probed, or readmitted by a health check instead
            ready = engine.next_probe_at is not None and now >= engine.next_probe_at
            in_due_wave = any(
                self._serves(engine.role, role) and self._wave_due(role, now) for role in wave_roles
            )
            if ready or in_due_wave:
                due.append(engine.url)
        for url in due:
            self._engines[url].probing = True
            self._log.add(now, "probe", url)
        return due

    def on_probe(self, url: str, now: float, outcome: ProbeOutcome) -> None:
        """Record the outcome of a probe started by :meth:`due_probes`."""
        engine = self._engines.get(url)
        if engine is None or not engine.probing:
            return
        engine.probing = False
        self._log.add(now, "probe_result", url, outcome=outcome.value)
        if engine.draining:
            return  # removed while it was probed: nothing more to learn
        if outcome is ProbeOutcome.PASSED:
            if engine.eject_reason == JOINING_REASON:
                self._join(engine, now)
            else:
                self._readmit(engine, now, "probe")
            return
        if outcome is ProbeOutcome.FAILED:
            engine.failed_probes += 1
        else:  # inconclusive: nothing learned about the engine, back to the normal cadence
            engine.failed_probes = 0
        factor = min(2.0**engine.failed_probes, self._recovery.probe_backoff_cap)
        engine.next_probe_at = now + self._jittered(self._recovery.probe_interval_s * factor)

    # ------------------------------------------------------------------ fleet changes

    def add_joining(self, url: str, role: Role, now: float) -> None:
        """A new engine ``url``: JOINING, probed at once, placeable once a probe passes."""
        engine = EngineHealth(url, role, ejected_since=now, eject_reason=JOINING_REASON)
        engine.next_probe_at = now
        self._engines[url] = engine
        self._log.add(now, "join_start", url, role=role.value)

    def start_drain(self, url: str, now: float) -> None:
        """``url`` leaves the fleet: it stops being a member of its roles (those left may now
        be a whole wave, probed at once) and is never probed again."""
        engine = self._engines[url]
        engine.draining = True
        engine.capped = False
        self._log.add(now, "drain", url)
        for role, members in self._members.items():
            if engine in members:
                members.remove(engine)
                self._start_wave_if_whole(role, now)

    def cancel_drain(self, url: str, now: float) -> None:
        """``url``, draining, is listed again: a member once more, its health state kept."""
        engine = self._engines[url]
        engine.draining = False
        self._log.add(now, "drain_cancelled", url)
        self._add_member(engine)

    def forget(self, url: str) -> None:
        """Drop a draining engine (nothing holds it, no probe of it is in flight)."""
        del self._engines[url]

    # ------------------------------------------------------------------ internals

    def _join(self, engine: EngineHealth, now: float) -> None:
        engine.ejected_since = None
        engine.eject_reason = None
        engine.epoch += 1
        engine.failed_probes = 0
        engine.next_probe_at = None
        self._add_member(engine)
        self._log.add(now, "join", engine.url)
        for other in self._engines.values():  # a larger role: room under the cap
            if other.capped and not self._ejection_capped(other):
                self._eject(other, now, "breaker")

    def _add_member(self, engine: EngineHealth) -> None:
        """``engine`` serves its roles again (kept in fleet order, for stable iteration)."""
        order = list(self._engines)
        for role, members in self._members.items():
            if self._serves(engine.role, role) and engine not in members:
                members.append(engine)
                members.sort(key=lambda e: order.index(e.url))

    def _eject(self, engine: EngineHealth, now: float, reason: str) -> None:
        engine.capped = False
        engine.ejected_since = now
        engine.eject_reason = reason
        engine.epoch += 1
        engine.times_ejected += 1
        engine.failed_probes = 0
        engine.next_probe_at = now + self._jittered(self._recovery.probe_interval_s)
        self._log.add(now, "eject", engine.url, reason=reason, streak=engine.streak)
        for role in (Role.PREFILL, Role.DECODE):
            if self._serves(engine.role, role):
                self._start_wave_if_whole(role, now)

    def _start_wave_if_whole(self, role: Role, now: float) -> None:
        """Every member of ``role`` is ejected: probe them all at once."""
        if not self._whole_wave(role):
            return
        for other in self._members[role]:
            if not other.probing:
                other.next_probe_at = now
        self._log.add(now, "whole_wave", None, role=role.value)

    def _readmit(self, engine: EngineHealth, now: float, via: str) -> None:
        engine.ejected_since = None
        engine.eject_reason = None
        engine.quarantined_until = None
        engine.prefill_streak = engine.decode_streak = 0
        engine.epoch += 1
        engine.failed_probes = 0
        engine.next_probe_at = None
        engine.probe_producer = None
        self._log.add(now, "readmit", engine.url, via=via)
        for other in self._engines.values():  # room under the cap: capped engines go now
            if other.capped and not self._ejection_capped(other):
                self._eject(other, now, "breaker")

    def _jittered(self, delay: float) -> float:
        return delay * self._rng.uniform(1.0 - JITTER, 1.0 + JITTER)

    @staticmethod
    def _serves(engine_role: Role, role: Role) -> bool:
        return engine_role.produces if role is Role.PREFILL else engine_role.consumes

    def _whole_wave(self, role: Role) -> bool:
        members = self._members[role]
        return bool(members) and all(e.ejected_since is not None for e in members)

    def _ejection_capped(self, engine: EngineHealth) -> bool:
        """Whether ejecting ``engine`` would take a role it serves over the ejection cap."""
        percent = self._recovery.max_ejection_percent
        for role, members in self._members.items():
            if not self._serves(engine.role, role):
                continue
            allowed = max(1, len(members) * percent // 100)
            ejected = sum(1 for e in members if e.ejected_since is not None)
            if ejected + 1 > allowed:
                return True
        return False

    def _wave_due(self, role: Role, now: float) -> bool:
        """A wave is probed together: all members are due once the earliest one is."""
        times = [
            e.next_probe_at
            for e in self._members[role]
            if self._awaits_probe(e) and e.next_probe_at is not None
        ]
        return bool(times) and now >= min(times)

    def _awaits_probe(self, engine: EngineHealth) -> bool:
        """Ejected or joining, not being probed, not draining, and readmitted by a probe (not
        by a health check)."""
        if engine.ejected_since is None or engine.probing or engine.draining:
            return False
        return engine.eject_reason != "health" or self._contract
