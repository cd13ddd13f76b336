"""Flow control in core, driven by the real SimPy driver: ordering, fairness, TTL, bounds,
saturation gate (narwhal.core.flow, narwhal.core.entry)."""

from __future__ import annotations

from typing import Any

import pytest
import simpy

from narwhal.core.config import NarwhalConfig
from narwhal.core.entry import admit_and_serve
from narwhal.core.flow import REASONS, FlowHeaderError, FlowKey, classify
from narwhal.core.policies import Policies
from narwhal.core.records import RequestRecord
from narwhal.core.routing.load import EngineLoad
from narwhal.sim.driver import SINK, make_ports, start

ENGINES = [
    {"url": "http://127.0.0.1:8100", "role": "prefill"},
    {"url": "http://127.0.0.1:8200", "role": "decode"},
]


def config(**flow: Any) -> NarwhalConfig:
    return NarwhalConfig.model_validate(
        {
            "engines": ENGINES,
            "admission": {"max_requests_in_flight": 1},
            "flow": {"enabled": True, "saturation_gate": False, **flow},
        }
    )


def run(policies: Policies, arrivals: list[tuple[float, str, FlowKey]], work_s: float):
    """Each arrival holds its slot for ``work_s`` of simulated time; returns the order served
    (with start times) and the refusal records."""
    env = simpy.Environment()
    ports = make_ports(env, {})
    served: list[tuple[str, float]] = []
    refused: list[RequestRecord] = []

    def arrive(at: float, request_id: str, key: FlowKey) -> Any:
        yield env.timeout(at)

        async def serve() -> None:
            served.append((request_id, float(env.now)))
            await ports.clock.sleep(work_s)

        def done(record: RequestRecord | None) -> None:
            if record is not None:
                refused.append(record)

        coro = admit_and_serve(request_id, float(env.now), ports, policies, SINK, serve, key)
        start(env, coro, done)

    for at, request_id, key in arrivals:
        env.process(arrive(at, request_id, key))
    env.run()
    return served, refused


def test_higher_band_first_then_round_robin_between_flows() -> None:
    policies = Policies(config(), seed=1)
    a, b, urgent = FlowKey(0, "a"), FlowKey(0, "b"), FlowKey(5, "c")
    arrivals = [(0.0, "a1", a), (0.1, "a2", a), (0.2, "a3", a), (0.3, "b1", b), (0.4, "u1", urgent)]
    served, refused = run(policies, arrivals, work_s=1.0)
    assert [name for name, _ in served] == ["a1", "u1", "a2", "b1", "a3"]
    assert [at for _, at in served] == [0.0, 1.0, 2.0, 3.0, 4.0]  # dispatched as slots free
    assert refused == []
    assert policies.admission.in_flight == 0 and policies.flow.queued == 0


def test_edf_orders_a_flow_by_deadline() -> None:
    policies = Policies(config(ordering="edf"), seed=1)
    arrivals = [
        (0.0, "first", FlowKey(0, "f", 9.0)),
        (0.1, "late", FlowKey(0, "f", 5.0)),
        (0.2, "soon", FlowKey(0, "f", 1.0)),
        (0.3, "none", FlowKey(0, "f", None)),
    ]
    served, _ = run(policies, arrivals, work_s=1.0)
    assert [name for name, _ in served] == ["first", "soon", "late", "none"]


def test_queue_ttl_answers_503_naming_the_reason_and_charges_nothing() -> None:
    policies = Policies(config(queue_ttl_s=0.5), seed=1)
    served, refused = run(policies, [(0.0, "a", FlowKey(0, "")), (0.1, "b", FlowKey(0, ""))], 2.0)
    assert [name for name, _ in served] == ["a"]
    (record,) = refused
    assert record.status == 503 and record.outcome == "shed" and record.attempts == 0
    assert "queue_ttl" in (record.error or "") and record.engines == ()
    assert record.finished_s == pytest.approx(0.5)
    assert policies.flow.stats[0].refused == {**dict.fromkeys(REASONS, 0), "queue_ttl": 1}


def test_band_bound_holds_under_a_burst() -> None:
    policies = Policies(config(max_queue_per_band=3, queue_ttl_s=100.0), seed=1)
    arrivals = [(0.0, f"r{i}", FlowKey(0, str(i % 4))) for i in range(50)]
    served, refused = run(policies, arrivals, work_s=0.1)
    assert len(served) == 4  # one in flight, three queued
    assert len(refused) == 46 and all("queue_full" in (r.error or "") for r in refused)


def test_flow_off_is_plain_admission() -> None:
    cfg = config()
    policies = Policies(
        cfg.model_copy(update={"flow": cfg.flow.model_copy(update={"enabled": False})})
    )
    served, refused = run(policies, [(0.0, "a", FlowKey(0, "")), (0.1, "b", FlowKey(0, ""))], 1.0)
    assert [name for name, _ in served] == ["a"]
    assert [r.outcome for r in refused] == ["overloaded"]


def test_saturation_gate_holds_dispatch_until_load_falls() -> None:
    policies = Policies(config(saturation_gate=True, max_report_age_s=100.0), seed=1)
    policies.admission.limit = 10
    busy = EngineLoad(num_requests_waiting=10, num_requests_running=1, kv_cache_usage_perc=0.1)
    idle = EngineLoad(num_requests_waiting=0, num_requests_running=1, kv_cache_usage_perc=0.1)
    for entry in ENGINES:
        policies.placement.report_load(entry["url"], busy, 0.0)
    env = simpy.Environment()
    ports = make_ports(env, {})
    served: list[tuple[str, float]] = []

    def arrive(at: float, name: str) -> Any:
        yield env.timeout(at)

        async def serve() -> None:
            served.append((name, float(env.now)))
            await ports.clock.sleep(10.0)

        start(env, admit_and_serve(name, at, ports, policies, SINK, serve, FlowKey(0, "")))

    def recover() -> Any:
        yield env.timeout(2.0)
        policies.placement.report_load(ENGINES[1]["url"], idle, 2.0)
        policies.placement.report_load(ENGINES[0]["url"], idle, 2.0)

    env.process(arrive(0.0, "first"))  # nothing in flight: goes whatever the load
    env.process(arrive(0.5, "second"))  # gated until the reports fall
    env.process(recover())
    env.run()
    assert served[0] == ("first", 0.0)
    assert served[1][0] == "second" and 2.0 <= served[1][1] <= 2.0 + 0.05 + 1e-9


def test_stale_reports_count_saturated_and_no_reports_fail_open() -> None:
    policies = Policies(config(saturation_gate=True, max_report_age_s=1.0), seed=1)
    assert policies.flow.saturation(0.0) is None
    idle = EngineLoad(num_requests_waiting=0, num_requests_running=0, kv_cache_usage_perc=0.0)
    for entry in ENGINES:
        policies.placement.report_load(entry["url"], idle, 0.0)
    assert policies.flow.saturation(0.5) == 0.0
    assert policies.flow.saturation(1.5) == 1.0


def test_classify_reads_headers_and_refuses_bad_values() -> None:
    settings = config(api_key_priorities={"k1": -2}).flow
    key = classify(
        {
            "x-narwhal-priority": "3",
            "x-gateway-inference-fairness-id": "t1",
            "x-slo-ttft-ms": "250",
        },
        settings,
    )
    assert key == FlowKey(3, "t1", 0.25)
    assert classify({"authorization": "Bearer k1"}, settings).priority == -2
    with pytest.raises(FlowHeaderError, match="x-narwhal-priority"):
        classify({"x-narwhal-priority": "high"}, settings)
    with pytest.raises(FlowHeaderError, match="x-slo-ttft-ms"):
        classify({"x-slo-ttft-ms": "-1"}, settings)


def test_probabilistic_shedding_drops_only_sheddable_work_and_is_seeded() -> None:
    def refusals(seed: int, saturation_waiting: float) -> tuple[int, int]:
        policies = Policies(
            config(probabilistic_shedding=True, max_report_age_s=100.0, queue_ttl_s=100.0),
            seed=seed,
        )
        policies.admission.limit = 1_000
        load = EngineLoad(
            num_requests_waiting=saturation_waiting, num_requests_running=0, kv_cache_usage_perc=0
        )
        for entry in ENGINES:
            policies.placement.report_load(entry["url"], load, 0.0)
        arrivals = [(0.0, f"s{i}", FlowKey(-1, "")) for i in range(200)]
        arrivals += [(0.0, f"c{i}", FlowKey(0, "")) for i in range(200)]
        _, refused = run(policies, arrivals, work_s=0.01)
        sheddable = sum(r.request_id.startswith("s") for r in refused)
        assert all("(probabilistic)" in (r.error or "") for r in refused)
        return sheddable, len(refused) - sheddable

    # saturation 0.2 (1 waiting of 5): p = 0.2^5 x 300 = 0.096
    low, critical = refusals(1, 1.0)
    assert critical == 0 and 5 <= low <= 40
    assert refusals(1, 1.0) == (low, 0)  # the same seed drops the same requests
    # saturation 0.4: p = min(3.07, 1) = 1, every sheddable arrival dropped
    assert refusals(2, 2.0) == (200, 0)
