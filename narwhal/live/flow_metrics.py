"""Flow control's Prometheus families: per priority band and per fairness flow, queue length,
dispatches, time waited and refusals by reason.

Rule kept here: labels are bounded: bands are at most ``flow.max_bands`` (flow control folds
any further band into the nearest known one), reasons are :data:`narwhal.core.flow.REASONS`,
and fairness flows, which clients name, are at most ``flow.max_flow_labels`` names (the
heaviest flows) plus ``other`` and ``-`` (:mod:`narwhal.core.flow_labels`).

Theory of operation: read from the core's :class:`~narwhal.core.flow.FlowControl` at scrape
time, nothing kept here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from narwhal.core.flow import REASONS, FlowControl


def flow_families(flow: FlowControl) -> Iterator[Any]:
    """The families, one sample per band (and reason)."""
    length = GaugeMetricFamily(
        "narwhal_flow_queue_length", "requests waiting in flow control's queue", labels=["band"]
    )
    dispatched = CounterMetricFamily(
        "narwhal_flow_dispatched", "queued requests dispatched to serving", labels=["band"]
    )
    waited = CounterMetricFamily(
        "narwhal_flow_wait_seconds",
        "time the dispatched requests waited in the queue, summed",
        labels=["band"],
    )
    refused = CounterMetricFamily(
        "narwhal_flow_refused",
        "requests flow control refused (503), by reason",
        labels=["band", "reason"],
    )
    for band, stats in sorted(flow.stats.items()):
        label = str(band)
        length.add_metric([label], float(flow.queue_length(band)))
        dispatched.add_metric([label], float(stats.dispatched))
        waited.add_metric([label], stats.wait_s_total)
        counts = stats.refused or {}
        for reason in REASONS:
            refused.add_metric([label, reason], float(counts.get(reason, 0)))
    yield from (length, dispatched, waited, refused)
    yield from _per_flow(flow)


def _per_flow(flow: FlowControl) -> Iterator[Any]:
    """The same four families per fairness flow label (``narwhal_flow_fairness_*``)."""
    length = GaugeMetricFamily(
        "narwhal_flow_fairness_queue_length",
        "requests waiting in flow control's queue, per fairness flow",
        labels=["flow"],
    )
    dispatched = CounterMetricFamily(
        "narwhal_flow_fairness_dispatched",
        "queued requests dispatched to serving, per fairness flow",
        labels=["flow"],
    )
    waited = CounterMetricFamily(
        "narwhal_flow_fairness_wait_seconds",
        "time the dispatched requests waited in the queue, summed, per fairness flow",
        labels=["flow"],
    )
    refused = CounterMetricFamily(
        "narwhal_flow_fairness_refused",
        "requests flow control refused (503), per fairness flow and reason",
        labels=["flow", "reason"],
    )
    lengths = flow.flow_queue_lengths()
    for label, stats in sorted(flow.flow_labels.stats.items()):
        length.add_metric([label], float(lengths.get(label, 0)))
        dispatched.add_metric([label], float(stats.dispatched))
        waited.add_metric([label], stats.wait_s_total)
        for reason in REASONS:
            refused.add_metric([label, reason], float(stats.refused.get(reason, 0)))
    yield from (length, dispatched, waited, refused)
