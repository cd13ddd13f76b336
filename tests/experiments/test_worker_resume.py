"""A sweep run's row counts the streams the router resumed (runs.csv's ``resumed_requests``),
as the simulator's own summary does."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.experiments.plan import RunTask
from narwhal.experiments.worker import METRIC_FIELDS, run_task
from narwhal.sim.results import record_rows, summarize
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario
from tests.sim.conftest import BASE, merge


def _mapping(resume: bool) -> dict[str, Any]:
    fault = {
        "kind": "disconnect",
        "engine": "http://sim-d0",
        "at_s": 0.0,
        "duration_s": 1000.0,
        "after_tokens": 5,
    }
    return merge(
        BASE,
        {
            "fleet": {"prefill": 1, "decode": 2},
            "recovery": {"eject_after": 1000, "resume_streams": resume},
            "workload": {"rate": 5.0, "duration_s": 3.0},
            "faults": [fault],
            "sim": {"health_checks": False},
        },
    )


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "off"])
def test_the_run_row_counts_resumed_streams(resume: bool) -> None:
    mapping = _mapping(resume)
    outcome = run_task(RunTask(0, 0, 0, None, 7, mapping))
    assert "resumed_requests" in METRIC_FIELDS
    result = run(parse_scenario(mapping, "check"), 7)
    rows = record_rows(result)
    resumed = sum(1 for r in rows if r["resumes"])
    assert outcome.metrics["resumed_requests"] == resumed
    assert (resumed > 0) is resume
    if resume:
        assert summarize(result, rows)["resumed_requests"] == resumed
