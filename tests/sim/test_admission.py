"""The simulated router's admission bound: the same core decision as the live router's, so a
scenario shows what ``[admission] max_requests_in_flight`` does to a burst (refusals at arrival,
503 without touching an engine) and that the default bound leaves ordinary load alone."""

from __future__ import annotations

from narwhal.core.records import RequestRecord
from narwhal.sim.results import summarize
from narwhal.sim.runner import run

from .conftest import scenario

BURST = {"rate": 200.0, "duration_s": 1.5, "output": {"dist": "fixed", "value": 100}}


def peak_in_flight(records: list[RequestRecord]) -> int:
    """Most admitted requests overlapping at once (an end at t frees its slot for an arrival
    at t, as the bound saw it)."""
    edges = sorted(
        [(r.arrival, 1) for r in records] + [(r.arrival + r.finished_s, -1) for r in records],
        key=lambda edge: (edge[0], edge[1]),
    )
    peak = current = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


def test_a_burst_past_the_bound_is_refused_at_arrival_and_charges_no_engine() -> None:
    result = run(scenario(admission={"max_requests_in_flight": 8}, workload=BURST))
    refused = [r for r in result.records if r.outcome == "overloaded"]
    admitted = [r for r in result.records if r.outcome != "overloaded"]
    assert len(result.records) == len(result.arrivals) > 250
    assert len(refused) > 100 and admitted
    assert all(
        r.status == 503 and r.attempts == 0 and r.engines == () and r.finished_s == 0.0
        for r in refused
    )
    assert all(r.status == 200 for r in admitted)  # the admitted ones were served in full
    assert peak_in_flight(admitted) == 8  # the bound held, and was used to the full
    kinds = [d["kind"] for d in result.decisions]
    assert kinds.count("admission_refused") == len(refused)
    assert all(e["times_ejected"] == 0 for e in result.engines.values())
    summary = summarize(result)
    assert summary["errors_by_class"] == {"overloaded": len(refused)}
    assert summary["statuses"] == {"200": len(admitted), "503": len(refused)}


def test_the_default_bound_does_not_bind_on_ordinary_load() -> None:
    loose = run(scenario(workload=BURST))
    assert all(r.status == 200 for r in loose.records)
    assert 8 < peak_in_flight(list(loose.records)) < 512  # the burst the bound of 8 cut
    assert "admission_refused" not in {d["kind"] for d in loose.decisions}
