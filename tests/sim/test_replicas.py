"""N independent router replicas in front of one fleet (``[router] replicas``): each replica's
breaker needs its own ``eject_after`` failures, one replica is exactly the single router, and
bad settings are refused by name. Real SimPy, seeded."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.sim.results import summarize
from narwhal.sim.runner import RunResult, run
from narwhal.sim.scenario import Scenario, ScenarioError, parse_scenario

from .conftest import BASE, merge

BAD = "http://sim-p0"
# one producer answers every request with HTTP 500 for the whole run; requests arrive 0.25 s
# apart, so each failure is charged before the next request is placed
BAD_PRODUCER: dict[str, Any] = {
    "faults": [
        {"kind": "http_5xx", "engine": BAD, "at_s": 0.0, "duration_s": 3600.0, "probability": 1.0}
    ],
    "workload": {
        "kind": "fixed",
        "arrivals_s": [0.25 * i for i in range(80)],
        "prompt_tokens": 64,
        "output_tokens": 4,
    },
    "recovery": {"eject_after": 3, "max_attempts": 1, "probe_interval_s": 2.0},
}


def scenario(**extra: Any) -> Scenario:
    """The base test scenario with ``extra`` merged in, its workload replaced whole."""
    data = merge({k: v for k, v in BASE.items() if k != "workload"}, extra)
    return parse_scenario(data, "test")


def failed_on_bad(result: RunResult) -> int:
    return sum(1 for r in result.records if r.status != 200 and BAD in r.engines)


def bad_ejections_by_replica(result: RunResult) -> list[int]:
    ejected = [
        d.get("replica", 0) for d in result.decisions if d["kind"] == "eject" and d["engine"] == BAD
    ]
    return sorted(ejected)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_each_replica_needs_its_own_eject_after_failures(replicas: int) -> None:
    result = run(scenario(router={"replicas": replicas, "spread": "round_robin"}, **BAD_PRODUCER))
    assert len(result.records) == 80
    # the bad producer fails exactly eject_after requests per replica, then every replica
    # holds it out (its probes fail too, so none readmits it)
    assert failed_on_bad(result) == 3 * replicas
    assert bad_ejections_by_replica(result) == list(range(replicas))
    assert result.engines[BAD]["times_ejected"] == replicas
    assert all(r.status == 200 for r in result.records if BAD not in r.engines)


def test_random_spread_lands_everywhere_and_is_counted_per_replica() -> None:
    result = run(scenario(router={"replicas": 2}, **BAD_PRODUCER))
    summary = summarize(result)
    per = summary["replicas"]
    assert per["count"] == 2 and per["spread"] == "random"
    assert sum(per["requests"]) == 80 and min(per["requests"]) > 20
    assert per["failed_attempts"] == [3, 3]  # max_attempts = 1: a failed attempt = a 502
    assert per["ejections"] == [1, 1]
    assert failed_on_bad(result) == 6
    assert "ejected_by" in result.samples[0]
    late = [s for s in result.samples if s["engine"] == BAD and s["t"] >= 15.0]
    assert late and all(s["ejected_by"] == 2 for s in late)
    again = run(scenario(router={"replicas": 2}, **BAD_PRODUCER))
    assert again.replica_of == result.replica_of  # the spread is seeded


def test_one_replica_is_the_single_router() -> None:
    plain = run(scenario(**BAD_PRODUCER))
    one = run(scenario(router={"replicas": 1, "spread": "round_robin"}, **BAD_PRODUCER))
    assert [r.as_dict() for r in one.records] == [r.as_dict() for r in plain.records]
    assert one.decisions == plain.decisions and one.samples == plain.samples
    assert one.engines == plain.engines
    assert one.replica_of == {} and "replicas" not in summarize(one)
    assert "ejected_by" not in plain.samples[0]


@pytest.mark.parametrize(
    ("router", "named"),
    [
        ({"replicas": 0}, "router.replicas"),
        ({"replicas": 65}, "router.replicas"),
        ({"spread": "hash"}, "router.spread"),
        ({"workers": 2}, "router.workers"),
    ],
)
def test_bad_router_settings_are_refused_by_name(router: dict[str, Any], named: str) -> None:
    with pytest.raises(ScenarioError, match=named.replace(".", r"\.")):
        scenario(router=router)
