"""Load scrapes: each engine's ``GET /metrics`` read into a load report for ``least_loaded``.

Rule kept here: a scrape only ever feeds :meth:`~narwhal.core.placement.Placement.report_load`;
it never charges an engine (a failed or unusable scrape is not a stream failure: the breaker
does not hear of it) and never invents a load (the engine's previous report stays, and goes
stale after ``max_report_age_s``). Nothing is scraped unless a phase is placed by
``least_loaded``, so the default router sends engines nothing new. Written once against the
ports.

Theory of operation: :func:`load_scrape_loop` wakes every ``routing.least_loaded.
scrape_interval_s`` and spawns a scrape of each engine of a ``least_loaded`` phase
(:func:`scraped_engines`) that has none in flight, so a slow engine holds at most one. A
scrape (:func:`scrape_load`) is bounded in time (``max_report_age_s``, at most
:data:`SCRAPE_TIMEOUT_S`: a later answer is of no use) and in size
(:data:`~narwhal.core.routing.vllm_metrics.MAX_METRICS_BYTES`), read by
:func:`~narwhal.core.routing.vllm_metrics.engine_load` (the pinned model's samples, when a
contract pins one) and stamped with the time its answer arrived. A scrape that gives no load is
counted (``LoadReports.refused``) and, when that is news, logged as a ``load_report_ignored``
decision with the reason; the next good one logs ``load_report_resumed``. What a scrape's answer
means (:func:`scrape_outcome`) and what is done with it (:func:`take_scrape`) are the same in
both worlds: the simulator does not send the request (its engines' gauges are known exactly,
and a request would draw on their fault switches), but hands each answer, a load or the reason
there is none, to :func:`take_scrape` at the same interval (:mod:`narwhal.sim.loadreports`).
"""

from __future__ import annotations

from collections.abc import Callable

from narwhal.core.config import NarwhalConfig
from narwhal.core.policies import Policies
from narwhal.core.ports import CallResult, ConnectFailed, Ports, Reply
from narwhal.core.routing.load import EngineLoad
from narwhal.core.routing.vllm_metrics import MetricsRefused, engine_load

SCRAPE_TIMEOUT_S = 5.0
METRICS_PATH = "/metrics"


def scraped_engines(config: NarwhalConfig) -> list[str]:
    """The engines whose load is read: those serving a phase ``least_loaded`` places, or every
    engine while flow control's saturation detector reads them (config order; empty when
    neither does)."""
    routing, flow = config.routing, config.flow
    gated = flow.enabled and (flow.saturation_gate or flow.probabilistic_shedding)
    prefill = gated or routing.prefill == "least_loaded"
    decode = gated or routing.decode == "least_loaded"
    return [
        entry.url
        for entry in config.engines
        if (prefill and entry.role.produces) or (decode and entry.role.consumes)
    ]


def scrape_outcome(reply: CallResult, model: str | None) -> EngineLoad | str:
    """The load a scrape's answer reports, or why it reports none."""
    if isinstance(reply, ConnectFailed):
        return f"GET {METRICS_PATH} {reply.reason}"
    if not isinstance(reply, Reply):
        return f"GET {METRICS_PATH} timed out"
    if reply.status != 200:
        return f"GET {METRICS_PATH} answered HTTP {reply.status}"
    try:
        return engine_load(reply.body, model)
    except MetricsRefused as refused:
        return str(refused)


async def scrape_load(url: str, ports: Ports, policies: Policies) -> bool:
    """Scrape ``url`` once and report its load; False when the scrape gave none."""
    settings = policies.config.routing.least_loaded
    contract = policies.config.engine_contract
    timeout = min(SCRAPE_TIMEOUT_S, settings.max_report_age_s)
    reply = await ports.transport.call(
        url, "GET", METRICS_PATH, None, {}, ports.clock.now() + timeout
    )
    now = ports.clock.now()  # the answer's time, before reading it
    load = scrape_outcome(reply, contract.model if contract is not None else None)
    return take_scrape(url, load, now, policies)


def take_scrape(url: str, load: EngineLoad | str, now: float, policies: Policies) -> bool:
    """Report the ``load`` a scrape of ``url`` gave at ``now``, or count and (when that is
    news) log why it gave none; False when it gave none."""
    reports = policies.placement.load_reports
    if not reports.tracks(url):
        return False  # removed by a reload while it was scraped
    if isinstance(load, str):
        if reports.refuse(url, load):
            policies.log.add(now, "load_report_ignored", url, reason=load)
        return False
    was_failing = reports.problem(url) is not None
    policies.placement.report_load(url, load, now)
    if was_failing:
        policies.log.add(now, "load_report_resumed", url)
    return True


async def load_scrape_loop(ports: Ports, policies: Policies, *, stop: Callable[[], bool]) -> None:
    """Scrape every engine of a ``least_loaded`` phase each ``scrape_interval_s`` (returns at
    once when no phase uses ``least_loaded``)."""
    if not scraped_engines(policies.config):  # ([routing] is not reloadable)
        return
    interval = policies.config.routing.least_loaded.scrape_interval_s
    scraping: set[str] = set()

    def spawn_scrape(url: str) -> None:
        async def run() -> None:
            try:
                await scrape_load(url, ports, policies)
            finally:
                scraping.discard(url)

        scraping.add(url)
        ports.spawn(run)

    while not stop():
        for url in scraped_engines(policies.config):  # the fleet a reload may have changed
            if url not in scraping:
                spawn_scrape(url)
        await ports.clock.sleep(interval)
