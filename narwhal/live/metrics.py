"""Prometheus metrics and the ``/status`` document of one live router.

Rule kept here: metrics only *observe* the core; every count is derived from the core's own
records (the :class:`~narwhal.core.records.RequestRecord` of each request, each
:class:`~narwhal.core.records.Decision` of the decision log) or read from its state at scrape
time; the router process's own load (event-loop stalls, client connections) is read from what
counts it (its lag monitor, its edge server). Nothing here decides anything.

Theory of operation: :class:`RouterMetrics` owns a private ``CollectorRegistry``: counters and
histograms are fed by :meth:`on_record` and :meth:`on_decision` (the router hands the latter to
its ``DecisionLog`` as the log's ``on_decision`` callback). What every request adds to (its
count, attempts, placements, latency histograms, tokens) is kept as plain numbers in
:class:`_RequestCounts` and exported at scrape time in the series ``prometheus_client`` would
write for them; rarer events (ejections, retries...) are its own ``Counter`` objects. Gauges of
the fleet (engine state, failure streak, reservations in flight) are collected at scrape time
from the breaker and the placement; the process's own load by the collectors of
:mod:`narwhal.live.process_metrics`. :func:`status_document` builds ``GET /status`` (the shape
docs/live.md documents), converting monotonic times to the epoch.
"""

from __future__ import annotations

import logging
import math
import platform
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from narwhal import __version__, build
from narwhal.core.admission import REFUSED
from narwhal.core.breaker import EngineState
from narwhal.core.policies import Policies
from narwhal.core.records import Decision, RequestRecord
from narwhal.core.routing.prefix import PrefixAffinity
from narwhal.core.stalls import StallLedger
from narwhal.live.clock import AnyioClock, to_wall
from narwhal.live.edge_counts import ClientConnections
from narwhal.live.flow_metrics import flow_families
from narwhal.live.process_metrics import ConnectionCollector, StallCollector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Time per output token: vLLM's buckets for its own histogram of the same name.
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)

# A counter's ``_created`` series doubles every series for a timestamp Prometheus does not use
# (and `promtool check metrics` flags); prometheus_client's switch for it is process-wide.
disable_created_metrics()  # type: ignore[no-untyped-call]

log = logging.getLogger("narwhal.live")


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
        for url, role in policies.engines_known():  # draining engines too, until forgotten
            current = policies.breaker.state(url, now)
            for candidate in EngineState:
                state.add_metric([url, role.value, candidate.value], float(candidate is current))
            streak.add_metric([url], float(policies.breaker.health(url).streak))
            for phase, count in policies.placement.counts[url].items():
                held.add_metric([url, phase], float(count))
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
        admission = policies.admission
        yield GaugeMetricFamily(
            "narwhal_admission_in_flight",
            "requests holding an admission slot (from arrival, body read included)",
            value=float(admission.in_flight),
        )
        yield GaugeMetricFamily(
            "narwhal_admission_limit",
            "admission.max_requests_in_flight",
            value=float(admission.limit),
        )
        if policies.flow.enabled:
            yield from flow_families(policies.flow)
        yield from _routing_families(policies, now)


def _routing_families(policies: Policies, now: float) -> Iterator[Any]:
    """Where prompts were prefilled, what the engines reported, and prefix_affinity's matches
    (all read from the core's placement at scrape time)."""
    placement = policies.placement
    prefills = CounterMetricFamily(
        "narwhal_prefills",
        "prefills by route: remote (a producer); short_prompt, no_producer and producer_failed"
        " (the consumer)",
        labels=["route"],
    )
    for route, count in placement.prefill_routes.as_dict().items():
        prefills.add_metric([route], float(count))
    yield prefills
    reports = placement.load_reports
    taken = CounterMetricFamily(
        "narwhal_load_reports", "engine load reports taken (scrapes)", labels=["engine"]
    )
    refused = CounterMetricFamily(
        "narwhal_load_reports_ignored",
        "scrapes that gave no usable load (the engine is not charged)",
        labels=["engine"],
    )
    names = ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc")
    load = GaugeMetricFamily(
        "narwhal_engine_reported_load",
        "the engine's latest load report (vLLM's gauge of that name)",
        labels=["engine", "gauge"],
    )
    age = GaugeMetricFamily(
        "narwhal_engine_load_report_age_seconds",
        "how old the engine's latest load report is",
        labels=["engine"],
    )
    for url in reports.reported:
        taken.add_metric([url], float(reports.reported[url]))
        refused.add_metric([url], float(reports.refused[url]))
        report = reports.latest(url)
        if report is not None:
            for name in names:
                load.add_metric([url, name], float(getattr(report.load, name)))
            age.add_metric([url], now - report.at)
    yield taken
    yield refused
    yield load
    yield age
    affinity = CounterMetricFamily(
        "narwhal_prefix_affinity",
        "prefix_affinity placements: hit (longest match), override (load guard), miss",
        labels=["phase", "result"],
    )
    for phase, policy in placement.routing.items():
        if isinstance(policy, PrefixAffinity):
            affinity.add_metric([phase, "hit"], float(policy.hits))
            affinity.add_metric([phase, "override"], float(policy.overrides))
            affinity.add_metric([phase, "miss"], float(policy.misses))
    yield affinity


class _Histogram:
    """One histogram series as plain numbers: observations by bucket (the last is ``+Inf``)
    and their sum. Exported by :class:`_RequestCounts` as prometheus_client exports its own."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # a bucket counts the values at most its bound (``le``): the first bound >= value
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs, cumulative, ending at ``+Inf``."""
        running, pairs = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            pairs.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
        return pairs


class _ModelSeries:
    """The request-level series of one model label (a bounded set: ``ModelLabels``)."""

    __slots__ = (
        "e2e_latency",
        "generation_tokens",
        "prompt_tokens",
        "time_per_output_token",
        "time_to_first_token",
        "time_to_prefill",
    )

    def __init__(self) -> None:
        self.e2e_latency = _Histogram(E2E_BUCKETS)
        self.time_to_prefill = _Histogram(LATENCY_BUCKETS)
        self.time_to_first_token = _Histogram(LATENCY_BUCKETS)
        self.time_per_output_token = _Histogram(TPOT_BUCKETS)
        self.generation_tokens = 0
        self.prompt_tokens = 0


# (name, help, buckets' attribute of _ModelSeries), in the order they are exported
_HISTOGRAMS = (
    (
        "narwhal_time_to_first_token_seconds",
        "arrival to the first generated output sent on (the client's time to first token; "
        "the contract's first_byte_s)",
        "time_to_first_token",
    ),
    (
        "narwhal_time_to_prefill_seconds",
        "arrival to the producer's prefill leg completed (the contract's ttft_s)",
        "time_to_prefill",
    ),
    (
        "narwhal_e2e_request_latency_seconds",
        "arrival to the end of the response, every request",
        "e2e_latency",
    ),
    (
        "narwhal_time_per_output_token_seconds",
        "mean time between generated outputs after the first, per successful request",
        "time_per_output_token",
    ),
)


class _RequestCounts:
    """What every request adds to: counts and histograms kept as plain numbers, exported at
    scrape time (:meth:`collect`). Every request and both of its placements update them, so
    they skip ``prometheus_client``'s per-update lock and label lookup: the router updates and
    scrapes them from its one event-loop thread."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int, str], int] = {}  # (outcome, status, model)
        self.attempts = 0
        self.placements: dict[tuple[str, str], int] = {}  # (engine, phase): the fleet's engines
        self.per_model: dict[str, _ModelSeries] = {}

    def collect(self) -> Iterator[Any]:
        requests = CounterMetricFamily(
            "narwhal_requests",
            "client requests by outcome and status",
            labels=["outcome", "status", "model"],
        )
        for (outcome, status, model), count in self.requests.items():
            requests.add_metric([outcome, str(status), model], float(count))
        yield requests
        for name, doc, attribute in _HISTOGRAMS:
            family = HistogramMetricFamily(name, doc, labels=["model"])
            for model, series in self.per_model.items():
                histogram: _Histogram = getattr(series, attribute)
                family.add_metric([model], histogram.cumulative(), histogram.total)
            yield family
        generated = CounterMetricFamily(
            "narwhal_generation_tokens", "generated outputs sent to clients", labels=["model"]
        )
        prompts = CounterMetricFamily(
            "narwhal_prompt_tokens",
            "prompt tokens of client requests, as the engines reported them (usage.prompt_tokens "
            "of the prefill reply or of the decode's usage chunk; a request no engine reported "
            "for is not counted)",
            labels=["model"],
        )
        for model, series in self.per_model.items():
            generated.add_metric([model], float(series.generation_tokens))
            prompts.add_metric([model], float(series.prompt_tokens))
        yield generated
        yield prompts
        yield CounterMetricFamily(
            "narwhal_attempts", "prefill/decode attempts started", value=float(self.attempts)
        )
        placements = CounterMetricFamily(
            "narwhal_placements", "phase placements", labels=["engine", "phase"]
        )
        for (engine, phase), count in self.placements.items():
            placements.add_metric([engine, phase], float(count))
        yield placements


class RouterMetrics:
    """The router's Prometheus registry, fed by records and decisions."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The contract's two times, named for what they measure (docs/live.md): the client's
        # time to first token is first_byte_s (narwhal_time_to_first_token_seconds); ttft_s
        # ends when the prefill leg does (narwhal_time_to_prefill_seconds).
        self.counts = _RequestCounts()
        r.register(self.counts)
        self.build_info = Gauge(
            "narwhal_build_info",
            "1, labelled with the build: version, Python, compiled or pure",
            ["version", "python", "build"],
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version(), build()).set(1)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes...
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
        self.resumes = Counter(  # reason: the fault (resumed) or narwhal.core.resume's refusal
            "narwhal_stream_resumes",
            "committed streams whose consumer failed: resumed elsewhere or refused, and why",
            ["outcome", "reason"],
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
        self.panics = Counter(
            "narwhal_panics",
            "times a phase entered panic (too few engines in service: spread over all)",
            ["phase"],
            registry=r,
        )
        self.ejections_capped = Counter(
            "narwhal_ejections_capped",
            "ejections not made because of recovery.max_ejection_percent",
            ["engine"],
            registry=r,
        )
        self.empty_streams_charged = Counter(
            "narwhal_empty_streams_charged",
            "streams ended before any token, charged to their consumer once another engine "
            "answered the same request with tokens",
            ["engine"],
            registry=r,
        )
        self.stale = Counter(
            "narwhal_stale_results", "late results ignored by the breaker", ["engine"], registry=r
        )
        self.admission_refused = Counter(
            "narwhal_admission_refused",
            "requests refused (503) at admission.max_requests_in_flight: the router's own",
            registry=r,
        )
        self.client_blocked = Counter(
            "narwhal_client_blocked_writes",
            "writes to a client that outlasted the engine's silence deadline (not charged)",
            registry=r,
        )
        self.config_reloads = Counter(
            "narwhal_config_reloads",
            "configuration reloads by result: applied, unchanged, refused (a key that does "
            "not reload), invalid (unreadable or not valid)",
            ["result"],
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
        self.registry.register(StallCollector(ledger))

    def attach_connections(self, connections: ClientConnections) -> None:
        """Start collecting the client connection counts of ``connections``."""
        self.registry.register(ConnectionCollector(connections))

    def on_record(self, record: RequestRecord, model: str) -> None:
        """Count one finished request; ``model`` is its label (bounded: ``ModelLabels``)."""
        counts = self.counts
        key = (record.outcome, record.status, model)
        counts.requests[key] = counts.requests.get(key, 0) + 1
        counts.attempts += record.attempts
        series = counts.per_model.get(model)
        if series is None:  # once per label value (a bounded set)
            series = counts.per_model[model] = _ModelSeries()
        series.e2e_latency.observe(record.finished_s)
        series.generation_tokens += record.output_tokens
        if record.prompt_tokens is not None:
            series.prompt_tokens += record.prompt_tokens
        if record.ttft_s is not None:
            series.time_to_prefill.observe(record.ttft_s)
        if record.first_byte_s is not None:
            series.time_to_first_token.observe(record.first_byte_s)
            if record.status == 200 and record.output_tokens > 1:
                decode_s = record.finished_s - record.first_byte_s
                series.time_per_output_token.observe(decode_s / (record.output_tokens - 1))

    def on_decision(self, decision: Decision) -> None:
        engine = decision.engine or ""
        kind = decision.kind
        if kind == "place":  # twice per request
            key = (engine, str(dict(decision.detail).get("phase", "")))
            placements = self.counts.placements
            placements[key] = placements.get(key, 0) + 1
            return
        detail = dict(decision.detail)
        if kind == "eject":
            self.ejections.labels(engine, str(detail.get("reason", ""))).inc()
        elif kind == "readmit":
            self.readmissions.labels(engine, str(detail.get("via", ""))).inc()
        elif kind == "probe_result":
            self.probes.labels(engine, str(detail.get("outcome", ""))).inc()
        elif kind == "retry":
            self.retries.labels(engine, str(detail.get("fault", ""))).inc()
        elif kind == "resume":
            self.resumes.labels(str(detail.get("outcome", "")), str(detail.get("reason", ""))).inc()
        elif kind == "quarantine":
            self.quarantines.labels(engine).inc()
        elif kind == "stale":
            self.stale.labels(engine).inc()
        elif kind == "quarantine_fallback":
            self.quarantine_fallbacks.labels(engine, str(detail.get("phase", ""))).inc()
        elif kind == "panic":
            self.panics.labels(str(detail.get("phase", ""))).inc()
        elif kind == "eject_capped":
            self.ejections_capped.labels(engine).inc()
        elif kind == "empty_stream_charged":
            self.empty_streams_charged.labels(engine).inc()
        elif kind == "load_report_ignored":  # logged only when the reason changes
            log.warning("load report of %s ignored: %s", engine, detail.get("reason"))
        elif kind == "load_report_resumed":
            log.info("load reports of %s resumed", engine)
        elif kind == REFUSED:
            self.admission_refused.inc()
        elif kind == "client_blocked":
            self.client_blocked.inc()
        elif kind == "reload":
            self.config_reloads.labels(str(detail.get("result", ""))).inc()
        elif kind == "client_cut":
            self.client_cuts.labels(str(detail.get("reason", ""))).inc()

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def status_document(
    policies: Policies,
    clock: AnyioClock,
    kv_streams: Callable[[str], dict[str, Any] | None] | None = None,
    connections: ClientConnections | None = None,
) -> dict[str, Any]:
    """The ``GET /status`` JSON (times in seconds since the epoch). ``kv_streams``: an engine's
    KV event stream (:meth:`narwhal.live.kv_events.KvEventSubscriber.status`), shown as its
    ``kv_events`` when the router follows streams. ``connections``: the router's client
    connections, shown as ``connections``."""
    now = clock.now()
    engines: list[dict[str, Any]] = []
    for url, role in policies.engines_known():  # joining and draining engines too
        health = policies.breaker.health(url)
        state = policies.breaker.state(url, now)
        quarantined = health.quarantined_until
        if quarantined is not None and quarantined <= now:
            quarantined = None
        ejected = None if state is EngineState.JOINING else health.ejected_since
        engines.append(
            {
                "url": url,
                "role": role.value,
                "state": state.value,
                "failure_streak": health.streak,
                "ejected_since": to_wall(clock, ejected),
                "quarantined_until": to_wall(clock, quarantined),
                "reservations": dict(policies.placement.counts[url]),
                **_load_status(policies, clock, url),
                **({} if kv_streams is None else {"kv_events": kv_streams(url)}),
            }
        )
    return {
        "engines": engines,
        # per phase: no engine is ready, so placement falls back on a quarantined one
        "quarantine_fallback": {
            phase: policies.placement.falls_back(phase, now) for phase in ("prefill", "decode")
        },
        "prefills": policies.placement.prefill_routes.as_dict(),
        "requests_in_flight": policies.budget.active_requests,
        "retries_in_flight": policies.budget.active_retries,
        # the router's own bound: slots held (from arrival, body read included) and refusals
        "admission": {
            "in_flight": policies.admission.in_flight,
            "max_requests_in_flight": policies.admission.limit,
            "refused": policies.admission.refused,
        },
        # its edge's client connections: open (this request's own among them), the bound,
        # refused at it since start, and those whose request body is still arriving
        **({} if connections is None else {"connections": connections.status()}),
        "time": clock.wall(),
        # [flow] enabled: per band, queue length, queued, dispatched, mean wait, refusals
        **({"flow": policies.flow.snapshot()} if policies.flow.enabled else {}),
        # and per fairness flow label (the heaviest flows by name, the rest as "other")
        **({"flow_fairness": policies.flow.flow_snapshot()} if policies.flow.enabled else {}),
    }


def _load_status(policies: Policies, clock: AnyioClock, url: str) -> dict[str, Any]:
    """An engine's latest load report (None: never reported) and why its latest scrape gave
    none (None: it gave one, or nothing is scraped)."""
    reports = policies.placement.load_reports
    report = reports.latest(url)
    load = None
    if report is not None:
        load = {
            "num_requests_waiting": report.load.num_requests_waiting,
            "num_requests_running": report.load.num_requests_running,
            "kv_cache_usage_perc": report.load.kv_cache_usage_perc,
            "reported_at": to_wall(clock, report.at),
        }
    return {"load": load, "load_problem": reports.problem(url)}
