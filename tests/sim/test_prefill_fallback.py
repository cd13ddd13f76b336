"""``[routing] prefill_fallback = "local"`` in the simulator (real SimPy, seeded): producers
crash, hang and answer HTTP 500, and no request is lost, each one whose producer attempts all
failed being prefilled by its consumer; with "none" the same faults cost requests. The producers
are charged for their faults (ejected), the consumers never."""

from __future__ import annotations

from narwhal.sim.runner import RunResult, run
from tests.sim.conftest import scenario

PRODUCER_FAULTS = [
    {"kind": "crash", "engine": "http://sim-p0", "at_s": 2.0, "duration_s": 4.0},
    {"kind": "hang", "engine": "http://sim-p1", "at_s": 3.0, "duration_s": 3.0},
    {"kind": "http_5xx", "engine": "http://sim-p1", "at_s": 7.0, "duration_s": 3.0},
    {"kind": "http_5xx", "engine": "http://sim-p0", "at_s": 7.0, "duration_s": 3.0},
]


def simulate(fallback: str) -> RunResult:
    return run(
        scenario(
            faults=PRODUCER_FAULTS,
            routing={"prefill_fallback": fallback},
            workload={"duration_s": 12.0},
        )
    )


def test_producer_faults_cost_no_request_with_the_local_fallback() -> None:
    without, with_local = simulate("none"), simulate("local")
    assert len(without.records) == len(with_local.records) > 200  # the same arrivals
    lost = [r for r in without.records if r.status != 200]
    assert len(lost) >= 5 and all(r.engines[-1].startswith("http://sim-p") for r in lost)
    assert all(r.status == 200 for r in with_local.records)
    fell_back = [r for r in with_local.records if r.prefill_fallback]
    assert len(fell_back) >= len(lost)
    for record in fell_back:  # a producer failed, then a consumer served it whole
        assert record.engines[0].startswith("http://sim-p")
        assert record.engines[-1].startswith("http://sim-d")
        assert record.output_tokens == 20
    assert not any(r.prefill_fallback for r in without.records)
    decisions = with_local.decisions
    local = [d for d in decisions if d["kind"] == "prefill_local"]
    assert len(local) == len(fell_back) and {d["reason"] for d in local} == {"producer_failed"}
    ejected = {d["engine"] for d in decisions if d["kind"] == "eject"}
    assert ejected and all(url.startswith("http://sim-p") for url in ejected)
