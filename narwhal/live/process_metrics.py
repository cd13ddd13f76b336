"""The router process's own load as Prometheus families: its event loop's stalls and its client
connections.

Rule kept here: read at scrape time from what counts them (the lag monitor's
:class:`~narwhal.core.stalls.StallLedger`, the edge server's
:class:`~narwhal.live.edge_counts.ClientConnections`); nothing is counted or kept here. Both
are of one process: with ``narwhal serve --workers N``, of the worker that answered the scrape.

Theory of operation: each is a ``prometheus_client`` custom collector that
:class:`narwhal.live.metrics.RouterMetrics` registers (``attach_stalls``,
``attach_connections``); a scrape calls its ``collect``, which yields one family per number.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from narwhal.core.stalls import StallLedger
from narwhal.live.edge_counts import ClientConnections


class StallCollector:
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


class ConnectionCollector:
    """Scrape-time gauges and counter of the router's client connections (its edge server's
    counts)."""

    def __init__(self, connections: ClientConnections) -> None:
        self._connections = connections

    def collect(self) -> Iterator[Any]:
        connections = self._connections
        yield GaugeMetricFamily(
            "narwhal_client_connections_open",
            "client connections open (accepted, not yet closed); client.max_connections bounds it",
            value=float(connections.open),
        )
        yield GaugeMetricFamily(
            "narwhal_client_connections_limit",
            "client.max_connections",
            value=float(connections.limit),
        )
        yield CounterMetricFamily(
            "narwhal_client_connections_refused",
            "client connections closed at accept because client.max_connections were open",
            value=float(connections.refused),
        )
        yield GaugeMetricFamily(
            "narwhal_client_connections_reading_body",
            "requests whose head arrived and whose body is still arriving",
            value=float(connections.reading_body),
        )
