"""Resumable streams in the simulator: the core's one resume decision, driven by SimPy, against
simulated engines that die mid-stream."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.sim.results import record_rows, summarize
from narwhal.sim.runner import RunResult, run
from tests.sim.conftest import scenario

DYING = "http://sim-d0"


def _run(kind: str, resume: bool, endpoint: str = "completions", **recovery: Any) -> RunResult:
    fault = {"kind": kind, "engine": DYING, "at_s": 0.0, "duration_s": 1000.0, "after_tokens": 5}
    return run(
        scenario(
            fleet={"prefill": 1, "decode": 2},
            recovery={"eject_after": 1000, "resume_streams": resume, **recovery},
            workload={"rate": 5.0, "duration_s": 3.0, "endpoint": endpoint},
            faults=[fault],
            sim={"health_checks": False},
        )
    )


@pytest.mark.parametrize(
    ("kind", "reason", "endpoint"),
    [
        ("disconnect", "closed_before_done", "completions"),
        ("stall", "silence", "completions"),
        ("inband_error", "inband_error", "completions"),
        ("disconnect", "closed_before_done", "chat"),  # continued as completions from its ids
    ],
)
def test_streams_a_dying_consumer_broke_are_resumed_whole(
    kind: str, reason: str, endpoint: str
) -> None:
    result = _run(kind, resume=True, endpoint=endpoint)
    rows = record_rows(result)
    hit = [r for r in rows if r["engines"].split()[1] == DYING]
    assert hit and len(hit) < len(rows)  # some were placed on the dying consumer first
    assert all(r["status"] == 200 for r in rows)
    for row in hit:  # resumed once, on the other consumer, after a fresh prefill
        producer, first, again, second = row["engines"].split()
        assert (first, again, second) == (DYING, producer, "http://sim-d1")
        assert row["resumes"] == 1 and row["resume_refused"] is None
        # every token the client asked for, once: 5 from the dying leg, the rest resumed
        assert row["delivered_tokens"] == row["output_tokens"]
        assert row["output_events"] == row["output_tokens"]
    resumed = [d for d in result.decisions if d["kind"] == "resume"]
    assert {(d["outcome"], d["reason"], d["engine"]) for d in resumed} == {
        ("resumed", reason, DYING)
    }
    summary = summarize(result, rows)
    assert summary["resumed_requests"] == len(hit) and summary["resume_refused"] == {}


def test_without_resume_the_same_faults_end_the_streams() -> None:
    on, off = _run("disconnect", resume=True), _run("disconnect", resume=False)
    failed = [r for r in off.records if r.status != 200]
    assert failed and {(r.outcome, r.committed) for r in failed} == {("closed_before_done", True)}
    assert all(r.status == 200 for r in on.records)
    assert "resumed_requests" not in summarize(off)
    assert not [d for d in off.decisions if d["kind"] == "resume"]


def test_a_refused_resume_is_counted_by_reason() -> None:
    result = _run("disconnect", resume=True, max_resumes=0)
    summary = summarize(result)
    failed = [r for r in result.records if r.status != 200]
    assert failed and summary["resumed_requests"] == 0
    assert summary["resume_refused"] == {"max_resumes": len(failed)}
