"""Faults are engine behaviours; the core's lifecycle, breaker and probes react to them."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.errors import DONE_BEFORE_TOKEN_TEXT
from narwhal.sim.faults import STREAM_FAULTS
from narwhal.sim.runner import RunResult, run
from tests.sim.conftest import scenario


def _decisions(result: RunResult, kind: str, engine: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in result.decisions
        if d["kind"] == kind and (engine is None or d["engine"] == engine)
    ]


def test_hung_decode_engine_is_ejected_then_readmitted_by_a_probe() -> None:
    hung = "http://sim-d0"
    result = run(
        scenario(
            faults=[{"kind": "hang", "engine": hung, "at_s": 2.0, "duration_s": 6.0}],
            workload={"duration_s": 16.0},
        )
    )
    ejects = _decisions(result, "eject", hung)
    assert len(ejects) == 1
    assert ejects[0]["reason"] == "breaker" and ejects[0]["streak"] == 3  # eject_after = 3
    failed = [r for r in result.records if r.status != 200]
    assert {r.status for r in failed} == {504}  # health stays 200: only timeouts tell
    assert {r.outcome for r in failed} <= {"first_token_timeout", "silence"}
    assert all(hung in r.engines for r in failed)
    readmits = _decisions(result, "readmit", hung)
    assert len(readmits) == 1 and readmits[0]["via"] == "probe"
    assert readmits[0]["t"] >= 8.0  # not before the engine recovered
    eject_t, readmit_t = ejects[0]["t"], readmits[0]["t"]
    placed = [
        d
        for d in _decisions(result, "place", hung)
        if d["phase"] == "decode" and eject_t < d["t"] < readmit_t
    ]
    assert placed == []  # no client traffic while ejected
    probes = _decisions(result, "probe_result", hung)
    assert [p["outcome"] for p in probes][-1] == "passed"
    assert any(p["outcome"] == "failed" for p in probes)  # probes during the hang fail


def test_crashed_producer_is_retried_around_ejected_and_readmitted() -> None:
    crashed = "http://sim-p0"
    result = run(
        scenario(
            faults=[{"kind": "crash", "engine": crashed, "at_s": 2.5, "duration_s": 4.0}],
            recovery={"max_attempts": 2, "retry_budget_min": 10},
            workload={"duration_s": 12.0},
        )
    )
    assert _decisions(result, "retry")
    assert all(r.status == 200 for r in result.records)  # every refusal was retried elsewhere
    assert _decisions(result, "eject", crashed)
    readmits = _decisions(result, "readmit", crashed)
    assert readmits and readmits[0]["t"] >= 6.5


FAULT_CASES = [
    # kind, engine, extra, expected status, outcome
    ("inband_error", "http://sim-d0", {}, 500, "inband_error"),
    ("early_done", "http://sim-d0", {}, 502, "done_before_token"),
    ("http_5xx", "http://sim-d0", {}, 502, "engine_5xx"),
    ("refused", "http://sim-d0", {}, 502, "refused"),
    ("kv_transfer_fail", "http://sim-d0", {}, 500, "inband_error"),
    ("release_handoff", "http://sim-p0", {}, 500, "inband_error"),
    ("bad_descriptor", "http://sim-p0", {}, 502, "bad_descriptor"),
    ("disconnect", "http://sim-d0", {"after_tokens": 5}, 502, "closed_before_done"),
    ("stall", "http://sim-d0", {"after_tokens": 5}, 504, "silence"),
]


@pytest.mark.parametrize(("kind", "engine", "extra", "status", "outcome"), FAULT_CASES)
def test_request_faults_reach_the_client_as_the_contract_says(
    kind: str, engine: str, extra: dict[str, Any], status: int, outcome: str
) -> None:
    fault = {"kind": kind, "engine": engine, "at_s": 0.0, "duration_s": 1000.0, **extra}
    result = run(
        scenario(
            fleet={"prefill": 1, "decode": 1},
            recovery={"eject_after": 1000},
            workload={"rate": 5.0, "duration_s": 2.0},
            faults=[fault],
            sim={"health_checks": False},  # a refusing engine also fails /health (then: 503)
        )
    )
    assert result.records
    assert {(r.status, r.outcome) for r in result.records} == {(status, outcome)}
    committed = {r.committed for r in result.records}
    assert committed == ({True} if "after_tokens" in extra else {False})
    if kind == "early_done":
        assert {r.error for r in result.records} == {DONE_BEFORE_TOKEN_TEXT}


@pytest.mark.parametrize("kind", sorted(STREAM_FAULTS))
def test_every_stream_fault_acts_after_its_tokens(kind: str) -> None:
    """The vocabulary's stream faults are the ones the simulated engine acts out mid-stream."""
    fault = {"kind": kind, "engine": "http://sim-d0", "at_s": 0.0, "duration_s": 1000.0}
    result = run(
        scenario(
            fleet={"prefill": 1, "decode": 1},
            recovery={"eject_after": 1000},
            workload={"rate": 5.0, "duration_s": 2.0},
            faults=[{**fault, "after_tokens": 3}],
        )
    )
    assert result.records
    assert {(r.committed, r.output_tokens) for r in result.records} == {(True, 3)}


def test_slow_engine_serves_everything_but_later() -> None:
    def tpot(factor: float) -> float:
        faults = [
            {
                "kind": "slow",
                "engine": "http://sim-d0",
                "at_s": 0.0,
                "duration_s": 99.0,
                "factor": factor,
            }
        ]
        result = run(
            scenario(
                fleet={"prefill": 1, "decode": 1},
                workload={"rate": 5.0, "duration_s": 3.0},
                faults=faults,
            )
        )
        assert all(r.status == 200 for r in result.records)
        return sum(r.finished_s - (r.first_byte_s or 0.0) for r in result.records)

    assert tpot(3.0) > 2.5 * tpot(1.0)


def test_rate_faults_are_seeded() -> None:
    spec = {
        "faults": [{"kind": "crash", "role": "any", "rate_per_hour": 720.0, "duration_s": 1.0}],
        "workload": {"duration_s": 5.0},
    }
    a, b = run(scenario(**spec)), run(scenario(**spec))
    assert a.fault_windows and a.fault_windows == b.fault_windows
    c = run(scenario(**spec), seed=99)
    assert c.fault_windows != a.fault_windows


def test_coalesced_reads_give_the_same_run_as_one_wake_up_per_chunk() -> None:
    """Holding plain token chunks back for the router's next wake-up (the default) changes no
    decision, record or timing: every fault kind that ends or breaks a stream is in play."""
    faults = [
        {"kind": "hang", "engine": "http://sim-d0", "at_s": 2.0, "duration_s": 3.0},
        {"kind": "crash", "engine": "http://sim-d1", "at_s": 6.0, "duration_s": 2.0},
        {
            "kind": "stall",
            "engine": "http://sim-d1",
            "at_s": 1.0,
            "duration_s": 4.0,
            "probability": 0.3,
            "after_tokens": 5,
        },
        {
            "kind": "inband_error",
            "engine": "http://sim-d0",
            "at_s": 7.0,
            "duration_s": 3.0,
            "probability": 0.3,
            "after_tokens": 3,
        },
        {"kind": "slow", "engine": "http://sim-p0", "at_s": 3.0, "duration_s": 3.0, "factor": 3.0},
    ]
    base = {
        "faults": faults,
        "workload": {"duration_s": 12.0, "output": {"dist": "uniform", "low": 2, "high": 60}},
        "recovery": {"max_attempts": 2, "retry_budget_min": 10},
    }
    eager = run(scenario(**base, sim={"coalesce_reads": False}))
    held = run(scenario(**base))
    assert {r.outcome for r in held.records} > {"ok"}  # faults really hit streams
    assert held.records == eager.records
    assert held.decisions == eager.decisions
    assert held.engines == eager.engines


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"kind": "crash", "role": "any", "at_s": 1.0, "factor": 2.0}, "'factor' applies to"),
        ({"kind": "hang", "role": "any", "at_s": 1.0, "probability": 0.5}, "whole engine"),
        ({"kind": "http_5xx", "role": "any", "at_s": 1.0, "after_tokens": 3}, "stream kinds"),
        ({"kind": "crash", "engine": "http://sim-p0", "at_s": 1.0, "count": 2}, "'count' is"),
        ({"kind": "crash", "role": "decode", "rate_per_hour": 1.0, "count": 2}, "'count' is"),
        ({"kind": "crash", "role": "both", "at_s": 1.0}, "no engine of role 'both'"),
        ({"kind": "crash", "role": "decode", "at_s": 1.0, "count": 3}, "the fleet has 2"),
        ({"kind": "stall", "role": "prefill", "at_s": 1.0}, "does nothing on role 'prefill'"),
        ({"kind": "early_done", "engine": "http://sim-p1", "at_s": 1.0}, "role prefill"),
        ({"kind": "bad_descriptor", "role": "decode", "at_s": 1.0}, "does nothing on role"),
        ({"kind": "crash", "engine": "http://sim-x", "at_s": 1.0}, "is not in the fleet"),
        # the shared vocabulary: old names, the emulator's faults and parameters
        ({"kind": "done_first", "role": "any", "at_s": 1.0}, "now called 'early_done'"),
        ({"kind": "status", "role": "any", "at_s": 1.0}, "now called 'http_5xx'"),
        ({"kind": "reset", "role": "any", "at_s": 1.0}, "by the emulator only"),
        ({"kind": "http_5xx", "role": "any", "at_s": 1.0, "code": 503}, "in the simulator"),
        ({"kind": "stall", "role": "any", "at_s": 1.0, "after": 2}, "now called 'after_tokens'"),
    ],
)
def test_a_fault_that_would_do_nothing_or_ignore_a_key_is_refused(
    fault: dict[str, Any], message: str
) -> None:
    # The run must be what the file says: no silently dropped windows or ignored keys.
    with pytest.raises(ValueError, match=message) as caught:
        scenario(faults=[{"kind": "refused", "role": "any", "at_s": 0.5}, fault])
    assert "faults[1]" in str(caught.value)


def test_role_any_picks_only_engines_that_can_act_the_fault_out() -> None:
    stall = {"kind": "stall", "role": "any", "rate_per_hour": 3600.0, "duration_s": 0.5}
    result = run(scenario(faults=[stall], workload={"duration_s": 4.0}))
    assert result.fault_windows
    assert {w.url for w in result.fault_windows} <= {"http://sim-d0", "http://sim-d1"}
