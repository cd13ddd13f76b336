"""Engine-reported load and the ``least_loaded`` policy that ranks engines by it.

Rule kept here: a load report is used only while it is fresh — at most ``max_report_age_s``
old (a report exactly that old still counts); an older report, or none, is *unknown*, and when
any candidate's load is unknown the choice is ``least_reserved`` over all candidates, so an
engine that stopped reporting (or was never scraped) is neither starved nor flooded.

Theory of operation: drivers (the live maintenance loop scraping vLLM's ``/metrics``, the
simulated engine, the emulator) call ``Placement.report_load(url, load, now)`` with an
:class:`EngineLoad`; :class:`LoadReports` keeps the latest report per engine (one older than
the one held is ignored). :class:`LeastLoaded` scores each candidate::

    waiting_weight * (num_requests_waiting + placements since the report)
      + running_weight * num_requests_running + kv_cache_weight * kv_cache_usage_perc

and the lowest score wins; equal scores go to ``least_reserved`` among them. The placements a
policy made on an engine since that engine's report count as waiting requests: the report
cannot show them yet, and without them every request between two scrapes would go to the same
engine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from narwhal.core.config import LeastLoadedSettings
from narwhal.core.requests import ClientRequest
from narwhal.core.routing.policy import Counts, RoutingPolicy, least_reserved


@dataclass(frozen=True)
class EngineLoad:
    """What an engine reports about its load (vLLM's gauges of the same names).

    ``num_requests_waiting``/``num_requests_running``: requests queued / in the running batch
    (gauges, so floats are accepted as Prometheus writes them); ``kv_cache_usage_perc``: the
    share of KV-cache blocks in use, 0..1 (vLLM's name says percent; the value is a fraction).
    What is not a number raises TypeError; a negative or non-finite value, or a KV share over
    1, ValueError (a driver drops such a scrape: the engine's load stays what it last was).
    """

    num_requests_waiting: float
    num_requests_running: float
    kv_cache_usage_perc: float

    def __post_init__(self) -> None:
        for name in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"):
            value = getattr(self, name)
            if not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and at least 0, got {value!r}")
        if self.kv_cache_usage_perc > 1:
            raise ValueError(
                f"kv_cache_usage_perc is a fraction 0..1, got {self.kv_cache_usage_perc!r}"
            )


@dataclass(frozen=True)
class LoadReport:
    """One engine's load as reported at ``at`` (the clock placement runs on)."""

    load: EngineLoad
    at: float


class LoadReports:
    """The latest load report of each engine of the fleet, and how its scrapes went."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = frozenset(urls)
        self._latest: dict[str, LoadReport] = {}
        self.reported = dict.fromkeys(urls, 0)  # reports taken, per engine
        self.refused = dict.fromkeys(urls, 0)  # scrapes that gave no usable load, per engine
        self._problem: dict[str, str] = {}  # why the engine's latest scrape gave no load

    def track(self, urls: Iterable[str]) -> None:
        """Also hold reports of ``urls`` (engines added by a reload)."""
        for url in urls:
            self.reported.setdefault(url, 0)
            self.refused.setdefault(url, 0)
        self._urls = frozenset(self.reported)

    def forget(self, url: str) -> None:
        """Drop ``url`` (an engine a reload removed) and what it reported."""
        self.reported.pop(url, None)
        self.refused.pop(url, None)
        self._latest.pop(url, None)
        self._problem.pop(url, None)
        self._urls = frozenset(self.reported)

    def tracks(self, url: str) -> bool:
        return url in self._urls

    def report(self, url: str, load: EngineLoad, now: float) -> None:
        """Record ``url``'s load as measured at ``now``; a report older than the held one is
        ignored (two scrapes answered out of order)."""
        if url not in self._urls:
            raise KeyError(f"no engine {url!r} in the fleet")
        self.reported[url] += 1
        self._problem.pop(url, None)
        held = self._latest.get(url)
        if held is None or now >= held.at:
            self._latest[url] = LoadReport(load, now)

    def refuse(self, url: str, reason: str) -> bool:
        """A scrape of ``url`` gave no usable load, for ``reason``: the held report stays (and
        goes stale). True when that is news: the previous scrape passed, or failed otherwise."""
        self.refused[url] += 1
        news = self._problem.get(url) != reason
        self._problem[url] = reason
        return news

    def problem(self, url: str) -> str | None:
        """Why ``url``'s latest scrape gave no load (None: it gave one, or none was made)."""
        return self._problem.get(url)

    def latest(self, url: str) -> LoadReport | None:
        """The latest report of ``url``, however old (None: it never reported)."""
        return self._latest.get(url)

    def fresh(self, url: str, now: float, max_age_s: float) -> LoadReport | None:
        """The latest report of ``url`` if it is at most ``max_age_s`` old at ``now``."""
        held = self._latest.get(url)
        if held is None or now - held.at > max_age_s:
            return None
        return held


class LeastLoaded(RoutingPolicy):
    """The lowest reported-load score (module docstring); unknown load: least_reserved."""

    name = "least_loaded"

    def __init__(
        self,
        phase: str,
        counts: Counts,
        rng: random.Random,
        reports: LoadReports,
        settings: LeastLoadedSettings,
    ) -> None:
        super().__init__(phase, counts, rng)
        self._reports = reports
        self._max_age_s = settings.max_report_age_s
        self._waiting = settings.waiting_weight
        self._running = settings.running_weight
        self._kv = settings.kv_cache_weight
        # per engine: the report the placements were counted against, and their number
        self._since: dict[str, tuple[LoadReport, int]] = {}

    def placements_since_report(self, url: str) -> int:
        """Placements this policy made on ``url`` since its latest report."""
        report = self._reports.latest(url)
        counted = self._since.get(url)
        return counted[1] if counted is not None and counted[0] is report else 0

    def score(self, url: str, report: LoadReport) -> float:
        load = report.load
        waiting = load.num_requests_waiting + self.placements_since_report(url)
        return (
            self._waiting * waiting
            + self._running * load.num_requests_running
            + self._kv * load.kv_cache_usage_perc
        )

    def choose(self, candidates: list[str], request: ClientRequest | None, now: float) -> str:
        scores: list[tuple[str, float]] = []
        for url in candidates:
            report = self._reports.fresh(url, now, self._max_age_s)
            if report is None:
                chosen = least_reserved(candidates, self._counts, self.phase, self._rng)
                self.placed(chosen, request, now)
                return chosen
            scores.append((url, self.score(url, report)))
        best = min(score for _, score in scores)
        tied = [url for url, score in scores if score == best]
        chosen = least_reserved(tied, self._counts, self.phase, self._rng)
        self.placed(chosen, request, now)
        return chosen

    def placed(self, url: str, request: ClientRequest | None, now: float) -> None:
        report = self._reports.latest(url)
        if report is not None:
            self._since[url] = (report, self.placements_since_report(url) + 1)
