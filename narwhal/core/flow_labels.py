"""Fairness flows as metric labels: the heaviest flows by traffic get their own label, every
other flow counts under ``other``.

Rule kept here: the label set is bounded whatever clients send: at most
``flow.max_flow_labels`` flow names plus :data:`OTHER`, and the traffic summary behind the
choice holds at most :data:`TRACKED_PER_LABEL` times as many flows. A flow's label never
changes once given, so every per-label counter only grows.

Theory of operation: :meth:`FlowLabels.label` is called once per request offered to flow
control. It counts the flow in a Space-Saving summary (Metwally et al., 2005: a bounded table
of counts; a flow not in a full table replaces the one with the least count and inherits that
count plus one, so a flow's count is never under its true traffic and a heavy flow cannot be
missed). While labels are free, a flow gets one once its count reaches
``flow.flow_label_min_requests`` and it is among the summary's ``max_flow_labels`` heaviest: a
crowd of one-request flows takes none, and a heavy flow arriving later still finds one. Counts
per label are :class:`FlowStats`; queue lengths per label are computed at scrape time by the
caller from its queues. A request without a fairness header is in flow ``""``, labelled
:data:`UNNAMED`; a client's flow named ``other`` or ``-`` shares that label and never gets its
own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OTHER = "other"
UNNAMED = "-"  # the label of the requests that name no fairness flow
TRACKED_PER_LABEL = 4  # the traffic summary tracks this many flows per label


@dataclass
class FlowStats:
    """Counters of one flow label (for metrics)."""

    queued: int = 0  # requests that entered the queue
    dispatched: int = 0
    wait_s_total: float = 0.0  # summed queue waits of the dispatched
    refused: dict[str, int] = field(default_factory=dict)


class FlowLabels:
    """Which label each fairness flow is counted under, and the counters per label."""

    def __init__(self, max_labels: int, min_requests: int) -> None:
        self.max_labels = max_labels
        self.min_requests = min_requests
        self._capacity = max(1, max_labels * TRACKED_PER_LABEL)
        self._counts: dict[str, int] = {}  # the Space-Saving summary: flow -> count
        self._labelled: dict[str, str] = {}  # flow -> its label, once given
        self.stats: dict[str, FlowStats] = {}

    def label(self, flow: str) -> str:
        """Count one request of ``flow``; the label it is counted under."""
        counts = self._counts
        if flow in counts:
            counts[flow] += 1
        elif len(counts) < self._capacity:
            counts[flow] = 1
        else:
            least = min(counts, key=counts.__getitem__)
            counts[flow] = counts.pop(least) + 1
        given = self._labelled.get(flow)
        if given is not None:
            return given
        if flow in ("", UNNAMED, OTHER):
            return UNNAMED if flow != OTHER else OTHER
        if len(self._labelled) < self.max_labels and counts[flow] >= self.min_requests:
            heavier = sum(1 for count in counts.values() if count > counts[flow])
            if heavier < self.max_labels:
                self._labelled[flow] = flow
                return flow
        return OTHER

    def labelled(self, flow: str) -> str:
        """The label ``flow`` is counted under now, counting nothing."""
        if flow in ("", UNNAMED):
            return UNNAMED
        return self._labelled.get(flow, OTHER)

    def stats_of(self, label: str) -> FlowStats:
        stats = self.stats.get(label)
        if stats is None:
            stats = self.stats[label] = FlowStats()
        return stats
