"""Prometheus metrics and the ``/status`` document of one live router.

Rule kept here: metrics only *observe* the core; every count is derived from the core's own
records (the :class:`~narwhal.core.records.RequestRecord` of each request, each
:class:`~narwhal.core.records.Decision` of the decision log) or read from its state at scrape
time. Nothing here decides anything.

Theory of operation: :class:`RouterMetrics` owns a private ``CollectorRegistry``: counters and
histograms are fed by :meth:`on_record` and :meth:`on_decision` (the router hands the latter to
its ``DecisionLog`` as the log's ``on_decision`` callback); gauges of the fleet (engine state,
failure streak, reservations in flight) are collected at scrape time from the breaker and the
placement. :func:`status_document` builds ``GET /status`` (the shape docs/live.md documents),
converting monotonic times to the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from narwhal.core.breaker import EngineState
from narwhal.core.policies import Policies
from narwhal.core.records import Decision, RequestRecord
from narwhal.core.stalls import StallLedger
from narwhal.live.clock import AnyioClock, to_wall

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _FleetCollector:
    """Scrape-time gauges read from the core's breaker and placement."""

    def __init__(self, policies: Policies, clock: AnyioClock) -> None:
        self._policies = policies
        self._clock = clock

    def collect(self) -> Iterator[Any]:
        policies, now = self._policies, self._clock.now()
        state = GaugeMetricFamily(
            "narwhal_engine_state",
            "1 for the engine's current state",
            labels=["engine", "role", "state"],
        )
        streak = GaugeMetricFamily(
            "narwhal_engine_failure_streak", "consecutive charged failures", labels=["engine"]
        )
        held = GaugeMetricFamily(
            "narwhal_reservations_in_flight", "phase reservations held", labels=["engine", "phase"]
        )
        for entry in policies.config.engines:
            current = policies.breaker.state(entry.url, now)
            for candidate in EngineState:
                state.add_metric(
                    [entry.url, entry.role.value, candidate.value], float(candidate is current)
                )
            streak.add_metric([entry.url], float(policies.breaker.health(entry.url).streak))
            for phase, count in policies.placement.counts[entry.url].items():
                held.add_metric([entry.url, phase], float(count))
        yield state
        yield streak
        yield held
        budget = policies.budget
        yield GaugeMetricFamily(
            "narwhal_requests_in_flight",
            "client requests being served",
            value=float(budget.active_requests),
        )
        yield GaugeMetricFamily(
            "narwhal_retries_in_flight",
            "retries holding retry budget",
            value=float(budget.active_retries),
        )


class _StallCollector:
    """Scrape-time counters of the router's own event-loop stalls (its lag monitor's ledger)."""

    def __init__(self, ledger: StallLedger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily(
            "narwhal_event_loop_stalls",
            "stalls of the router's event loop (deadlines pending during one are extended)",
            value=float(self._ledger.count),
        )
        yield CounterMetricFamily(
            "narwhal_event_loop_stalled_seconds",
            "seconds the router's event loop was stalled",
            value=self._ledger.total_s,
        )


class RouterMetrics:
    """The router's Prometheus registry, fed by records and decisions."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "narwhal_requests",
            "client requests by outcome and status",
            ["outcome", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "narwhal_ttft_s",
            "arrival to producer HTTP leg completed (s)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_byte = Histogram(
            "narwhal_first_byte_s",
            "arrival to first generated decode output (s)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.attempts = Counter("narwhal_attempts", "prefill/decode attempts started", registry=r)
        self.placements = Counter(
            "narwhal_placements", "phase placements", ["engine", "phase"], registry=r
        )
        self.ejections = Counter(
            "narwhal_ejections", "engines ejected", ["engine", "reason"], registry=r
        )
        self.readmissions = Counter(
            "narwhal_readmissions", "engines readmitted", ["engine", "via"], registry=r
        )
        self.probes = Counter(
            "narwhal_probes", "inference probes by outcome", ["engine", "outcome"], registry=r
        )
        self.retries = Counter(
            "narwhal_retries",
            "fresh attempts after a transient fault",
            ["engine", "fault"],
            registry=r,
        )
        self.quarantines = Counter(
            "narwhal_quarantines", "engines quarantined after a failure", ["engine"], registry=r
        )
        self.quarantine_fallbacks = Counter(
            "narwhal_quarantine_fallbacks",
            "placements on a quarantined engine because no engine of the phase was ready",
            ["engine", "phase"],
            registry=r,
        )
        self.ejections_capped = Counter(
            "narwhal_ejections_capped",
            "ejections not made because of recovery.max_ejection_percent",
            ["engine"],
            registry=r,
        )
        self.stale = Counter(
            "narwhal_stale_results", "late results ignored by the breaker", ["engine"], registry=r
        )
        self.client_blocked = Counter(
            "narwhal_client_blocked_writes",
            "writes to a client that outlasted the engine's silence deadline (not charged)",
            registry=r,
        )
        self.client_cuts = Counter(
            "narwhal_client_cutoffs",
            "clients cut off for not reading (their own fault, no engine charged)",
            ["reason"],
            registry=r,
        )

    def attach(self, policies: Policies, clock: AnyioClock) -> None:
        """Start collecting the fleet gauges of ``policies``."""
        self.registry.register(_FleetCollector(policies, clock))

    def attach_stalls(self, ledger: StallLedger) -> None:
        """Start collecting the event-loop stall counters of ``ledger``."""
        self.registry.register(_StallCollector(ledger))

    def on_record(self, record: RequestRecord) -> None:
        self.requests.labels(record.outcome, str(record.status)).inc()
        self.attempts.inc(record.attempts)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        if record.first_byte_s is not None:
            self.first_byte.observe(record.first_byte_s)

    def on_decision(self, decision: Decision) -> None:
        detail = dict(decision.detail)
        engine = decision.engine or ""
        kind = decision.kind
        if kind == "place":
            self.placements.labels(engine, str(detail.get("phase", ""))).inc()
        elif kind == "eject":
            self.ejections.labels(engine, str(detail.get("reason", ""))).inc()
        elif kind == "readmit":
            self.readmissions.labels(engine, str(detail.get("via", ""))).inc()
        elif kind == "probe_result":
            self.probes.labels(engine, str(detail.get("outcome", ""))).inc()
        elif kind == "retry":
            self.retries.labels(engine, str(detail.get("fault", ""))).inc()
        elif kind == "quarantine":
            self.quarantines.labels(engine).inc()
        elif kind == "stale":
            self.stale.labels(engine).inc()
        elif kind == "quarantine_fallback":
            self.quarantine_fallbacks.labels(engine, str(detail.get("phase", ""))).inc()
        elif kind == "eject_capped":
            self.ejections_capped.labels(engine).inc()
        elif kind == "client_blocked":
            self.client_blocked.inc()
        elif kind == "client_cut":
            self.client_cuts.labels(str(detail.get("reason", ""))).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def status_document(policies: Policies, clock: AnyioClock) -> dict[str, Any]:
    """The ``GET /status`` JSON (times in seconds since the epoch)."""
    now = clock.now()
    engines: list[dict[str, Any]] = []
    for entry in policies.config.engines:
        health = policies.breaker.health(entry.url)
        state = policies.breaker.state(entry.url, now)
        quarantined = health.quarantined_until
        if quarantined is not None and quarantined <= now:
            quarantined = None
        engines.append(
            {
                "url": entry.url,
                "role": entry.role.value,
                "state": state.value,
                "failure_streak": health.streak,
                "ejected_since": to_wall(clock, health.ejected_since),
                "quarantined_until": to_wall(clock, quarantined),
                "reservations": dict(policies.placement.counts[entry.url]),
            }
        )
    return {
        "engines": engines,
        # per phase: no engine is ready, so placement falls back on a quarantined one
        "quarantine_fallback": {
            phase: policies.placement.falls_back(phase, now) for phase in ("prefill", "decode")
        },
        "requests_in_flight": policies.budget.active_requests,
        "retries_in_flight": policies.budget.active_retries,
        "time": clock.wall(),
    }
