"""Load scrapes: which engines are read, a good page becoming a report least_loaded acts on,
and every failed scrape leaving the breaker alone, the old report in place and one decision
per change of reason."""

from __future__ import annotations

from typing import Any

from narwhal.core.breaker import EngineState
from narwhal.core.config import parse_config
from narwhal.core.loadscrape import load_scrape_loop, scrape_load, scraped_engines
from narwhal.core.policies import Policies
from narwhal.core.ports import CallResult, ConnectFailed, Reply, TimedOut
from narwhal.core.routing.load import EngineLoad
from tests.core.scripted import ScriptedTransport, VirtualClock, make_ports, run

P0, D0, D1, B0 = "http://p0", "http://d0", "http://d1", "http://b0"


def config(routing: dict[str, Any] | None = None, contract: bool = False) -> Any:
    data: dict[str, Any] = {
        "routing": routing if routing is not None else {"decode": "least_loaded"},
        "engines": [
            {"url": P0, "role": "prefill"},
            {"url": D0, "role": "decode"},
            {"url": D1, "role": "decode"},
            {"url": B0, "role": "both"},
        ],
    }
    if contract:
        data["engine_contract"] = {"model": "tiny-llama", "vllm_version": "0.32.0"}
    return parse_config(data)


def metrics_page(waiting: float, running: float, kv: float, model: str = "tiny-llama") -> bytes:
    labels = f'engine="0",model_name="{model}"'
    return (
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv}\n"
    ).encode()


class DeadlineTransport(ScriptedTransport):
    """The scripted engines, also noting the deadline of every GET."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock, {})
        self.deadlines: list[float] = []

    async def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> CallResult:
        self.deadlines.append(deadline)
        return await super().call(url, method, path, body, headers, deadline)


def setup(routing: dict[str, Any] | None = None, contract: bool = False):  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    transport = DeadlineTransport(clock)
    policies = Policies(config(routing, contract), seed=1)
    return clock, transport, policies, make_ports(clock, transport)


def test_only_the_engines_of_a_least_loaded_phase_are_scraped() -> None:
    assert scraped_engines(config({})) == []  # the default: nothing is scraped
    assert scraped_engines(config({"prefill": "random", "decode": "prefix_affinity"})) == []
    assert scraped_engines(config({"decode": "least_loaded"})) == [D0, D1, B0]
    assert scraped_engines(config({"prefill": "least_loaded"})) == [P0, B0]
    both = {"prefill": "least_loaded", "decode": "least_loaded"}
    assert scraped_engines(config(both)) == [P0, D0, D1, B0]


def test_a_good_page_is_a_report_stamped_when_it_arrived_and_least_loaded_acts_on_it() -> None:
    clock, transport, policies, ports = setup()
    transport.get_replies[(D0, "/metrics")] = Reply(200, metrics_page(4, 2, 0.5))
    transport.get_replies[(D1, "/metrics")] = Reply(200, metrics_page(0, 1, 0.25))
    transport.get_replies[(B0, "/metrics")] = Reply(200, metrics_page(9, 9, 0.9))
    for url in (D0, D1, B0):
        assert run(scrape_load(url, ports, policies)) is True
    report = policies.placement.load_reports.latest(D0)
    assert report is not None and report.load == EngineLoad(4, 2, 0.5) and report.at == clock.t
    assert transport.deadlines == [clock.t + 2.0] * 3  # bounded by max_report_age_s
    assert policies.placement.choose("decode", clock.now()) == D1


def test_the_pinned_models_samples_are_read() -> None:
    _clock, transport, policies, ports = setup(contract=True)
    page = metrics_page(7, 7, 0.7, model="other") + metrics_page(1, 0, 0.1)
    transport.get_replies[(D0, "/metrics")] = Reply(200, page)
    assert run(scrape_load(D0, ports, policies)) is True
    report = policies.placement.load_reports.latest(D0)
    assert report is not None and report.load == EngineLoad(1, 0, 0.1)


def test_a_failed_scrape_charges_nobody_keeps_the_old_report_and_logs_each_new_reason() -> None:
    clock, transport, policies, ports = setup()
    reports = policies.placement.load_reports
    transport.get_replies[(D0, "/metrics")] = Reply(200, metrics_page(1, 1, 0.1))
    run(scrape_load(D0, ports, policies))
    kept = reports.latest(D0)
    answers: list[Any] = [
        ConnectFailed("refused"),
        ConnectFailed("refused"),  # the same reason again: counted, not logged again
        TimedOut(),
        Reply(500, b"{}"),
        Reply(200, metrics_page(float("nan"), 1, 0.1)),
        Reply(200, b"not metrics"),
    ]
    for answer in answers:
        transport.get_replies[(D0, "/metrics")] = answer
        clock.t += 0.5
        assert run(scrape_load(D0, ports, policies)) is False
    assert reports.latest(D0) is kept and reports.refused[D0] == len(answers)
    logged = [d.as_dict() for d in policies.log.entries if d.kind == "load_report_ignored"]
    assert [d["reason"] for d in logged] == [
        "GET /metrics refused",
        "GET /metrics timed out",
        "GET /metrics answered HTTP 500",
        "num_requests_waiting must be finite and at least 0, got nan",
        "no vllm:num_requests_waiting sample",
    ]
    health = policies.breaker.health(D0)
    assert health.streak == 0 and policies.breaker.state(D0, clock.now()) is EngineState.READY
    assert reports.problem(D0) == "no vllm:num_requests_waiting sample"

    transport.get_replies[(D0, "/metrics")] = Reply(200, metrics_page(0, 0, 0.0))
    assert run(scrape_load(D0, ports, policies)) is True
    assert reports.problem(D0) is None and policies.log.entries[-1].kind == "load_report_resumed"
    assert reports.reported[D0] == 2


def test_the_loop_scrapes_each_engine_every_interval_with_one_in_flight() -> None:
    routing = {"decode": "least_loaded", "least_loaded": {"scrape_interval_s": 0.25}}
    clock, transport, policies, ports = setup(routing)
    spawned: list[Any] = []
    ports.spawn = spawned.append
    start = clock.t
    ticks = iter(range(100))
    counts: list[int] = []

    def stop() -> bool:
        tick = next(ticks)
        counts.append(len(spawned))
        if tick == 3:  # the scrapes in flight finish now
            for job in spawned:
                run(job())
        return tick >= 5

    run(load_scrape_loop(ports, policies, stop=stop))
    # one scrape per engine, none again while it is in flight, a new one once it finished
    assert counts == [0, 3, 3, 3, 6, 6] and clock.t == start + 5 * 0.25
    assert [c[0] for c in transport.calls] == [D0, D1, B0]
    assert all(c[2] == "/metrics" for c in transport.calls)


def test_the_loop_does_nothing_without_a_least_loaded_phase() -> None:
    clock, transport, policies, ports = setup({})
    spawned: list[Any] = []
    ports.spawn = spawned.append
    start = clock.t
    run(load_scrape_loop(ports, policies, stop=lambda: False))  # returns at once
    assert spawned == [] and transport.calls == [] and clock.t == start
