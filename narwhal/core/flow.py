"""Flow control: bounded per-priority queues in front of admission, fair between flows.

Rule kept here: with ``[flow] enabled = false`` nothing here runs and the router behaves exactly
as without it. Enabled, a request that finds no admission slot (or a saturated fleet) waits in
the queue of its priority band instead of being refused; it is dispatched only by
:meth:`FlowControl.pump`, which takes its admission slot for it, and leaves the queue only by
dispatch, by a refusal that names its reason (``queue_full``, ``queue_ttl``,
``probabilistic``, or ``deadline``: its request deadline came before its TTL and passed), or
by its client going away. No refusal here reaches placement, so no engine
is ever charged for one. Pure: time comes in as ``now``, randomness from the seeded RNG the
policies hand over.

Theory of operation: :func:`classify` reads a request's :class:`FlowKey` from its headers
(band from ``priority_header``, else the API key's entry in ``api_key_priorities``, else
``default_priority``; flow from ``fairness_header``; deadline from ``deadline_header``, in ms).
:meth:`FlowControl.offer` queues a :class:`Ticket` (or refuses it: its band's queue is full,
or it is sheddable and the probabilistic admitter drops it) and pumps. :meth:`pump` dispatches
while an admission slot is free and the fleet is not saturated: the highest band first; within
a band the flows take turns (round robin); within a flow the oldest (``fcfs``) or the earliest
deadline (``edf``: arrival + ``x-slo-ttft-ms``; requests without one after those with one).
The drivers' part (waiting on a ticket, the TTL, waking) is :mod:`narwhal.core.entry`.
Counters are kept per band (:class:`BandStats`) and per fairness flow label, a bounded set
(:mod:`narwhal.core.flow_labels`).

Saturation (:meth:`FlowControl.saturation`): per engine ``max(waiting / queue_threshold,
kv_usage / kv_threshold)`` from its latest load report; a report older than
``max_report_age_s``, or none from an engine when others report, counts as saturated (1).
The fleet is saturated when every producer or every consumer is (the best engine of the
bottleneck role is at 1 or more). When no engine has ever reported, the gate is open
(fail-open: a missing signal never stalls the router), and with nothing of this router in
flight the head request is dispatched whatever the reports say, so stale reports can slow
dispatch but never stop it.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from narwhal.core.admission import Admission
from narwhal.core.config import FlowSettings, Role
from narwhal.core.flow_labels import FlowLabels
from narwhal.core.records import DecisionLog
from narwhal.core.routing.load import LoadReports

QUEUE_FULL = "queue_full"
QUEUE_TTL = "queue_ttl"
PROBABILISTIC = "probabilistic"
DEADLINE = "deadline"
CLIENT_GONE = "client_gone"
REASONS = (QUEUE_FULL, QUEUE_TTL, PROBABILISTIC, DEADLINE)
"""Why flow control refuses a request (bounded: metric labels and record texts)."""


class Waker(Protocol):
    """What a queued request's driver waits on (:class:`narwhal.core.ports.Waiter`)."""

    def wake(self) -> None: ...


@dataclass(frozen=True)
class FlowKey:
    """Where a request queues: its band (below zero: sheddable), its fairness flow, and its
    TTFT objective in seconds (None: none given)."""

    priority: int
    flow: str
    slo_ttft_s: float | None = None


class FlowHeaderError(ValueError):
    """A flow header whose value is not what it must be (the client's fault: 400)."""


def classify(headers: Mapping[str, str], settings: FlowSettings) -> FlowKey:
    """The request's :class:`FlowKey` from its (lower-cased) headers; FlowHeaderError names
    the header whose value is bad."""
    raw = headers.get(settings.priority_header)
    if raw is not None:
        try:
            priority = int(raw.strip())
        except ValueError:
            raise FlowHeaderError(
                f"header {settings.priority_header}: {raw!r} is not an integer"
            ) from None
        if not -1000 <= priority <= 1000:
            raise FlowHeaderError(
                f"header {settings.priority_header}: {priority} not in -1000..1000"
            )
    else:
        priority = settings.default_priority
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and settings.api_key_priorities:
            priority = settings.api_key_priorities.get(auth[7:].strip(), priority)
    flow = headers.get(settings.fairness_header, "")[:256]
    slo: float | None = None
    raw_slo = headers.get(settings.deadline_header)
    if raw_slo is not None:
        try:
            slo_ms = float(raw_slo.strip())
        except ValueError:
            slo_ms = -1.0
        if not 0 < slo_ms <= 86_400_000:
            raise FlowHeaderError(
                f"header {settings.deadline_header}: {raw_slo!r} is not a positive number of ms"
            )
        slo = slo_ms / 1000.0
    return FlowKey(priority, flow, slo)


class Ticket:
    """One queued request: its key, times, and how it left the queue."""

    __slots__ = (
        "arrival",
        "expires",
        "flow_label",
        "key",
        "order",
        "request_id",
        "state",
        "waiter",
    )

    def __init__(self, request_id: str, key: FlowKey, arrival: float, expires: float) -> None:
        self.request_id = request_id
        self.key = key
        self.arrival = arrival
        self.expires = expires  # the queue TTL or the request deadline, whichever is first
        self.order = 0  # arrival sequence (ties in EDF go to the earlier)
        self.state = "queued"  # queued | dispatched | refused
        self.waiter: Waker | None = None
        self.flow_label = ""  # its fairness flow's metric label (narwhal.core.flow_labels)

    @property
    def dispatched(self) -> bool:
        return self.state == "dispatched"


class _Band:
    """One priority band: a queue per flow and the flows' turn order."""

    def __init__(self) -> None:
        self.flows: dict[str, list[tuple[float, int, Ticket]]] = {}
        self.turns: deque[str] = deque()  # flows with queued work, next to serve first
        self.size = 0

    def push(self, ticket: Ticket, rank: float) -> None:
        queue = self.flows.get(ticket.key.flow)
        if queue is None:
            queue = self.flows[ticket.key.flow] = []
            self.turns.append(ticket.key.flow)
        heapq.heappush(queue, (rank, ticket.order, ticket))
        self.size += 1

    def pop(self) -> Ticket:
        flow = self.turns.popleft()
        queue = self.flows[flow]
        ticket = heapq.heappop(queue)[2]
        if queue:
            self.turns.append(flow)  # its next request waits for the other flows' turns
        else:
            del self.flows[flow]
        self.size -= 1
        return ticket

    def remove(self, ticket: Ticket) -> None:
        queue = self.flows[ticket.key.flow]
        queue[:] = [entry for entry in queue if entry[2] is not ticket]
        heapq.heapify(queue)
        if not queue:
            del self.flows[ticket.key.flow]
            self.turns.remove(ticket.key.flow)
        self.size -= 1


@dataclass
class BandStats:
    """Counters of one band (for metrics and results)."""

    queued: int = 0  # requests that entered the queue
    dispatched: int = 0
    wait_s_total: float = 0.0  # summed queue waits of the dispatched
    refused: dict[str, int] | None = None

    def refuse(self, reason: str) -> None:
        if self.refused is None:
            self.refused = dict.fromkeys(REASONS, 0)
        self.refused[reason] = self.refused.get(reason, 0) + 1


class FlowControl:
    """The queues of one router, its dispatch gate and its counters."""

    def __init__(
        self,
        settings: FlowSettings,
        admission: Admission,
        reports: LoadReports,
        engines: Callable[[], Iterable[tuple[str, Role]]],
        rng: random.Random,
        log: DecisionLog,
    ) -> None:
        self.settings = settings
        self.enabled = settings.enabled
        self._admission = admission
        self._reports = reports
        self._engines = engines
        self._rng = rng
        self._log = log
        self._bands: dict[int, _Band] = {}
        self._order = 0
        self.queued = 0
        self.stats: dict[int, BandStats] = {}
        self.flow_labels = FlowLabels(settings.max_flow_labels, settings.flow_label_min_requests)
        self._dispatch_times: deque[float] = deque()  # recent dispatches, oldest first
        self._release_times: deque[float] = deque()  # recent ends of dispatched requests
        self.poller_running = False  # a driver's loop re-pumps while the gate is shut

    def band_label(self, priority: int) -> int:
        """``priority``, or the nearest band already known once ``max_bands`` are (bounds
        the label sets of metrics and results)."""
        if priority in self.stats or len(self.stats) < self.settings.max_bands:
            return priority
        return min(self.stats, key=lambda known: (abs(known - priority), known))

    def _stats(self, priority: int) -> BandStats:
        band = self.band_label(priority)
        stats = self.stats.get(band)
        if stats is None:
            stats = self.stats[band] = BandStats()
        return stats

    def queue_length(self, priority: int) -> int:
        band = self._bands.get(priority)
        return band.size if band is not None else 0

    def offer(self, now: float, request_id: str, key: FlowKey, deadline: float) -> Ticket | str:
        """Queue a request (and pump): its ticket, or the reason it is refused at once."""
        key = FlowKey(self.band_label(key.priority), key.flow, key.slo_ttft_s)
        stats = self._stats(key.priority)
        label = self.flow_labels.label(key.flow)
        if key.priority < 0 and self.settings.probabilistic_shedding:
            saturation = self.saturation(now)
            if saturation is not None and self._rng.random() < min(saturation**5 * 300, 1.0):
                return self._refuse(now, request_id, key, PROBABILISTIC, stats, label)
        band = self._bands.get(key.priority)
        if band is not None and band.size >= self.settings.max_queue_per_band:
            return self._refuse(now, request_id, key, QUEUE_FULL, stats, label)
        if band is None:
            band = self._bands[key.priority] = _Band()
        ticket = Ticket(request_id, key, now, min(deadline, now + self.settings.queue_ttl_s))
        ticket.flow_label = label
        self._order += 1
        ticket.order = self._order
        rank = now
        if self.settings.ordering == "edf":
            rank = now + key.slo_ttft_s if key.slo_ttft_s is not None else float("inf")
        band.push(ticket, rank)
        self.queued += 1
        stats.queued += 1
        self.flow_labels.stats_of(label).queued += 1
        self.pump(now)
        return ticket

    def _refuse(
        self,
        now: float,
        request_id: str,
        key: FlowKey,
        reason: str,
        stats: BandStats,
        label: str,
    ) -> str:
        stats.refuse(reason)
        refused = self.flow_labels.stats_of(label).refused
        refused[reason] = refused.get(reason, 0) + 1
        self._log.add(
            now, "flow_refused", None, request=request_id, band=key.priority, reason=reason
        )
        return reason

    def expire(self, ticket: Ticket, now: float, reason: str) -> None:
        """Take a still-queued ticket out: its TTL or its request deadline passed
        (``queue_ttl`` or ``deadline``, counted and logged) or its client left (``client_gone``,
        neither: the client, not the router, ended it)."""
        if ticket.state != "queued":
            return
        self._bands[ticket.key.priority].remove(ticket)
        self.queued -= 1
        ticket.state = "refused"
        if reason != CLIENT_GONE:
            stats = self._stats(ticket.key.priority)
            self._refuse(now, ticket.request_id, ticket.key, reason, stats, ticket.flow_label)

    def gate_shut(self, now: float) -> bool:
        """Whether the saturation detector holds dispatch back now."""
        if not self.settings.saturation_gate or self._admission.in_flight == 0:
            return False
        saturation = self.saturation(now)
        return saturation is not None and saturation >= 1.0

    def pump(self, now: float) -> int:
        """Dispatch queued requests while a slot is free and the gate is open; the count."""
        dispatched = 0
        while self.queued and not self.gate_shut(now) and self._admission.take():
            priority = max(p for p, band in self._bands.items() if band.size)
            ticket = self._bands[priority].pop()
            self.queued -= 1
            ticket.state = "dispatched"
            self._dispatch_times.append(now)
            stats = self._stats(priority)
            stats.dispatched += 1
            stats.wait_s_total += now - ticket.arrival
            by_flow = self.flow_labels.stats_of(ticket.flow_label)
            by_flow.dispatched += 1
            by_flow.wait_s_total += now - ticket.arrival
            dispatched += 1
            if ticket.waiter is not None:
                ticket.waiter.wake()
        return dispatched

    def released(self, now: float) -> None:
        """A request this router dispatched has ended (its slot is free): pump the queue."""
        self._release_times.append(now)
        if self.queued:
            self.pump(now)

    def saturation(self, now: float) -> float | None:
        """The fleet's saturation (the best engine of the bottleneck role; 1 or more:
        saturated), or None when no engine has ever reported (fail-open)."""
        settings = self.settings
        best: dict[bool, float] = {}  # producer side (True) / consumer side (False)
        reported = False
        # a report cannot show the requests dispatched since it was taken: those beyond the
        # ones that finished since count as waiting, spread evenly over the engines of a side
        dispatched = self._dispatch_times
        horizon = now - settings.max_report_age_s
        released = self._release_times
        for times in (dispatched, released):
            while times and times[0] < horizon:
                times.popleft()
        engines, sides = self._engine_roles()
        for url, role in engines:
            latest = self._reports.latest(url) if self._reports.tracks(url) else None
            reported = reported or latest is not None
            if latest is None or now - latest.at > settings.max_report_age_s:
                level = 1.0
            else:
                load = latest.load
                since = len(dispatched) - bisect.bisect_right(dispatched, latest.at)
                since -= len(released) - bisect.bisect_right(released, latest.at)
                since = max(0, since)
                level = max(
                    (load.num_requests_waiting + since / sides[role]) / settings.queue_threshold,
                    load.kv_cache_usage_perc / settings.kv_threshold,
                )
            for side, serves in ((True, role.produces), (False, role.consumes)):
                if serves:
                    best[side] = min(best.get(side, level), level)
        if not reported or not best:
            return None
        return max(best.values())

    def _engine_roles(self) -> tuple[list[tuple[str, Role]], dict[Role, int]]:
        """The engines, and per role how many engines share a dispatch of its side."""
        engines = list(self._engines())
        producers = sum(1 for _, role in engines if role.produces) or 1
        consumers = sum(1 for _, role in engines if role.consumes) or 1
        sides = {
            role: min(
                producers if role.produces else consumers, consumers if role.consumes else producers
            )
            for _, role in engines
        }
        return engines, sides

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per band: queue length, queued, dispatched, mean wait and refusals (``/status``)."""
        out: dict[str, dict[str, object]] = {}
        for band in sorted(self.stats, reverse=True):
            stats = self.stats[band]
            out[str(band)] = {
                "queue_length": self.queue_length(band),
                "queued": stats.queued,
                "dispatched": stats.dispatched,
                "mean_wait_s": stats.wait_s_total / stats.dispatched if stats.dispatched else 0.0,
                "refused": dict(stats.refused or dict.fromkeys(REASONS, 0)),
            }
        return out

    def flow_queue_lengths(self) -> dict[str, int]:
        """Requests queued now per fairness flow label (every band together)."""
        lengths = dict.fromkeys(self.flow_labels.stats, 0)
        for band in self._bands.values():
            for flow, queue in band.flows.items():
                label = self.flow_labels.labelled(flow)
                lengths[label] = lengths.get(label, 0) + len(queue)
        return lengths

    def flow_snapshot(self) -> dict[str, dict[str, object]]:
        """Per fairness flow label: the same fields as :meth:`snapshot`'s per band."""
        lengths = self.flow_queue_lengths()
        out: dict[str, dict[str, object]] = {}
        for label in sorted(self.flow_labels.stats):
            stats = self.flow_labels.stats[label]
            out[label] = {
                "queue_length": lengths.get(label, 0),
                "queued": stats.queued,
                "dispatched": stats.dispatched,
                "mean_wait_s": stats.wait_s_total / stats.dispatched if stats.dispatched else 0.0,
                "refused": {reason: stats.refused.get(reason, 0) for reason in REASONS},
            }
        return out
