"""Load reports in the simulation: each simulated engine tells placement its true load at the
scrape interval, as the live router learns it from ``GET /metrics``.

Rule kept here: only engines the live router would scrape report
(:func:`~narwhal.core.loadscrape.scraped_engines`: those of a ``least_loaded`` phase), every
``routing.least_loaded.scrape_interval_s`` of simulated time, so ``least_loaded`` sees load
exactly as stale as live; without a ``least_loaded`` phase nothing is scheduled and a run is
what it was without this module.

Theory of operation: one SimPy process reports, from time 0, each engine's vLLM gauges read off
its scheduler (:func:`engine_load`): ``num_requests_waiting`` the queued sequences plus those
waiting for their KV pull (vLLM keeps those in its waiting queue), ``num_requests_running`` the
sequences prefilling or decoding, ``kv_cache_usage_perc`` the share of KV blocks not free. A
crashed engine answers no scrape, so it reports nothing (its last report goes stale); a hung
one still serves ``/metrics`` (vLLM's API server lives on) with the gauges its engine core last
published, so it repeats the load it showed at its first scrape while hung. Each answer goes
through the core's handling of a scrape (:func:`~narwhal.core.loadscrape.take_scrape`), so a
crashed engine's refused scrape is counted and logged (``load_report_ignored``, then
``load_report_resumed``) as live logs it.
"""

from __future__ import annotations

from typing import Any

import simpy

from narwhal.core.loadscrape import scrape_outcome, scraped_engines, take_scrape
from narwhal.core.policies import Policies
from narwhal.core.ports import ConnectFailed
from narwhal.core.routing.load import EngineLoad
from narwhal.sim.gpu.engine import SimEngine


def engine_load(engine: SimEngine) -> EngineLoad:
    """The load ``engine``'s ``/metrics`` would show now."""
    load = engine.load()
    return EngineLoad(
        num_requests_waiting=load["waiting"] + load["transferring"],
        num_requests_running=load["prefilling"] + load["decoding"],
        kv_cache_usage_perc=1.0 - load["free_blocks"] / engine.params.num_blocks,
    )


def start_load_reports(
    env: simpy.Environment, engines: dict[str, SimEngine], policies: Policies
) -> None:
    """Schedule the reports (nothing when no phase is placed by ``least_loaded``)."""
    urls = scraped_engines(policies.config)
    if not urls:
        return
    interval = policies.config.routing.least_loaded.scrape_interval_s
    frozen: dict[str, EngineLoad] = {}  # a hung engine's gauges, as they were when it hung
    refused = scrape_outcome(ConnectFailed("refused"), None)  # a crashed engine's answer

    def report() -> Any:
        while True:
            now = float(env.now)
            for url in urls:
                engine = engines[url]
                switches = engine.switches
                load: EngineLoad | str
                if switches.down:
                    frozen.pop(url, None)
                    load = refused
                elif switches.hung:
                    load = frozen.setdefault(url, engine_load(engine))
                else:
                    frozen.pop(url, None)
                    load = engine_load(engine)
                take_scrape(url, load, now, policies)
            yield env.timeout(interval)

    env.process(report())
