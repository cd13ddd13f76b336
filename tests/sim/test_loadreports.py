"""Load reports in the simulator: the engines' true gauges reach placement every scrape
interval (and only with a least_loaded phase), through the core's handling of a scrape; a
crashed engine goes stale (its refused scrapes logged as live logs them), a hung one repeats
itself; and least_loaded, so fed, places differently from least_reserved on an uneven fleet."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import simpy

from narwhal.core.config import parse_config
from narwhal.core.policies import Policies
from narwhal.core.routing.load import EngineLoad
from narwhal.sim.driver import SimTransport, start
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.loadreports import engine_load, start_load_reports
from narwhal.sim.results import summarize
from narwhal.sim.runner import run
from narwhal.sim.timing import step_model

from .conftest import scenario

P0, D0, D1 = "http://sim-p0", "http://sim-d0", "http://sim-d1"


def fleet(routing: dict[str, Any]) -> tuple[simpy.Environment, dict[str, SimEngine], Policies]:
    env = simpy.Environment()
    net = KvNetwork(env, bandwidth_gbps=40.0, setup_s=0.001)
    params = EngineParams(model="llama3-8b", jitter=0.0, num_blocks=400)
    engines = {
        url: SimEngine(env, url, i, params, step_model("llama3-8b"), net, {}, random.Random(i))
        for i, url in enumerate((P0, D0, D1))
    }
    config = parse_config(
        {
            "routing": routing,
            "engines": [
                {"url": P0, "role": "prefill"},
                {"url": D0, "role": "decode"},
                {"url": D1, "role": "decode"},
            ],
        }
    )
    return env, engines, Policies(config, seed=1)


def stream(env: simpy.Environment, engines: dict[str, SimEngine], url: str, out: int) -> None:
    """A same-worker request on ``url`` (it prefills its own 300-token prompt)."""
    transport = SimTransport(env, engines)

    async def reader() -> None:
        body = {"prompt": "x" * 299, "max_tokens": out, "stream": True}
        opened = await transport.open_stream(url, "/v1/completions", body, {}, env.now + 99)
        while True:
            result = await transport.next_chunk(opened.handle, env.now + 99)  # type: ignore[union-attr]
            if not hasattr(result, "reads"):
                return

    start(env, reader())


def test_each_engine_of_the_least_loaded_phase_reports_its_true_load_every_interval() -> None:
    routing = {"decode": "least_loaded", "least_loaded": {"scrape_interval_s": 0.25}}
    env, engines, policies = fleet(routing)
    start_load_reports(env, engines, policies)
    for _ in range(3):
        stream(env, engines, D0, out=500)
    env.run(until=1.1)
    reports = policies.placement.load_reports
    assert reports.reported == {P0: 0, D0: 5, D1: 5}  # at 0, 0.25, 0.5, 0.75, 1.0
    latest = reports.latest(D0)
    assert latest is not None and latest.at == 1.0
    assert latest.load.num_requests_running == 3 and latest.load.num_requests_waiting == 0
    assert 0 < latest.load.kv_cache_usage_perc < 1
    idle = reports.latest(D1)
    assert idle is not None and idle.load == EngineLoad(0, 0, 0.0)


def test_without_a_least_loaded_phase_nothing_reports() -> None:
    env, engines, policies = fleet({"decode": "prefix_affinity"})
    start_load_reports(env, engines, policies)
    env.run(until=2.0)
    assert set(policies.placement.load_reports.reported.values()) == {0}


def test_a_crashed_engine_goes_stale_and_a_hung_one_repeats_its_last_load() -> None:
    routing = {"decode": "least_loaded", "least_loaded": {"scrape_interval_s": 0.25}}
    env, engines, policies = fleet(routing)
    start_load_reports(env, engines, policies)
    stream(env, engines, D0, out=5000)
    env.run(until=0.6)
    engines[D0].set_hung(True)
    engines[D1].crash()
    env.run(until=0.8)  # one scrape at 0.75
    reports = policies.placement.load_reports
    hung = reports.latest(D0)
    assert hung is not None and hung.at == 0.75
    stream(env, engines, D0, out=10)  # queued behind the hang: the frozen gauges do not show it
    env.run(until=1.6)
    again = reports.latest(D0)
    assert again is not None and again.at == 1.5 and again.load == hung.load
    assert engine_load(engines[D0]).num_requests_waiting == 1
    crashed = reports.latest(D1)
    assert crashed is not None and crashed.at == 0.5  # nothing since the crash
    # its refused scrapes take the core's path, as live: counted, and logged once (news)
    assert reports.refused[D1] == 4  # at 0.75, 1.0, 1.25, 1.5
    logged = [(d.t, d.kind, d.engine) for d in policies.log.entries if d.kind.startswith("load")]
    assert logged == [(0.75, "load_report_ignored", D1)]
    engines[D1].restart()
    env.run(until=1.8)  # the scrape at 1.75 answers again
    assert reports.latest(D1) is not None and reports.latest(D1).at == 1.75  # type: ignore[union-attr]
    assert [d.kind for d in policies.log.entries if d.kind.startswith("load")][-1] == (
        "load_report_resumed"
    )


UNEVEN: dict[str, Any] = {
    # one of the two consumers is four times slower for the whole run
    "faults": [{"kind": "slow", "engine": "http://sim-d0", "at_s": 0.0, "duration_s": 60.0,
                "factor": 4.0}],
    "workload": {"rate": 30.0, "duration_s": 20.0,
                 "prompt": {"dist": "uniform", "low": 100, "high": 3000},
                 "output": {"dist": "uniform", "low": 10, "high": 400}},
}  # fmt: skip


def placed_decodes(policy: str, seed: int) -> tuple[Counter[str], dict[str, Any]]:
    routing = {"decode": policy, "least_loaded": {"scrape_interval_s": 0.1}}
    result = run(scenario(routing=routing, sim={"seed": seed}, **UNEVEN))
    assert all(r.status == 200 for r in result.records)
    return Counter(r.engines[-1] for r in result.records), summarize(result)


def test_least_loaded_steers_from_a_slow_consumer_by_its_reports() -> None:
    loaded, _ = placed_decodes("least_loaded", seed=1)
    reserved, _ = placed_decodes("least_reserved", seed=1)
    # the reports steer decodes away from the slow consumer (as reservations do: on a fleet
    # that only this router sends to, its in-flight requests are most of what vLLM reports)
    assert loaded["http://sim-d0"] < loaded["http://sim-d1"] / 2
    assert loaded != reserved  # the reports, not the reservations, decided
