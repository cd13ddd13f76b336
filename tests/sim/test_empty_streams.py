"""Three bad consumers of five in the simulator (real SimPy, seeded): one hangs, one stalls after
three tokens, one answers ``[DONE]`` before any token. The empty streams are charged (a retry
elsewhere gets tokens), so all three reach ``eject_after``: two are ejected (the ejection cap,
``max_ejection_percent = 50``) and the third is CAPPED, placed only when no healthy consumer can
take it, which never happens while two healthy ones are ready. Every bad consumer fails its
probes (the stalling one too: a probe streams ``recovery.probe_decode_tokens`` = 8 tokens), so
none is readmitted and the capped one stays a last resort to the end; a probe of 2 tokens, shorter
than the stall, readmits the stalling consumer."""

from __future__ import annotations

from collections import Counter
from typing import Any

from narwhal.sim.runner import RunResult, run
from tests.sim.conftest import scenario

CONSUMERS = [f"http://sim-d{i}" for i in range(5)]
HUNG, STALLING, EMPTYING = CONSUMERS[:3]
BAD = {HUNG, STALLING, EMPTYING}
FOREVER = {"at_s": 0.0, "duration_s": 1000.0}


def _decisions(result: RunResult, kind: str) -> list[dict[str, Any]]:
    return [d for d in result.decisions if d["kind"] == kind]


def _run(probe_decode_tokens: int = 8) -> RunResult:
    return run(
        scenario(
            fleet={"prefill": 2, "decode": 5},
            recovery={
                "eject_after": 2,
                "max_attempts": 2,
                "probe_interval_s": 5.0,
                "probe_decode_tokens": probe_decode_tokens,
            },
            workload={"rate": 20.0, "duration_s": 8.0},
            faults=[
                {"kind": "hang", "engine": HUNG, **FOREVER},
                {"kind": "stall", "engine": STALLING, "after_tokens": 3, **FOREVER},
                {"kind": "early_done", "engine": EMPTYING, **FOREVER},
            ],
        )
    )


def test_the_capped_bad_consumer_is_a_last_resort() -> None:
    result = _run()
    # exactly two bad consumers are ejected and the third is capped
    first_capped = _decisions(result, "eject_capped")[0]
    capped, capped_at = first_capped["engine"], first_capped["t"]
    ejected = {d["engine"] for d in _decisions(result, "eject") if d["t"] <= capped_at}
    assert len(ejected) == 2 and ejected | {capped} == BAD
    assert EMPTYING in ejected, "its empty streams were charged: first to reach eject_after"
    assert _decisions(result, "readmit") == []  # every bad consumer fails its probes
    failed = Counter(
        d["engine"] for d in _decisions(result, "probe_result") if d["outcome"] == "failed"
    )
    assert set(failed) == BAD - {capped}, "the ejected ones are probed, and fail"
    in_window = Counter(
        d["engine"]
        for d in _decisions(result, "place")
        if d["phase"] == "decode" and capped_at < d["t"]
    )
    assert sum(in_window.values()) > 40
    assert not BAD & set(in_window), "no bad consumer placed while the capped one is the third"
    assert _decisions(result, "quarantine_fallback") == []
    window = [r for r in result.records if capped_at < r.arrival]
    assert window and all(r.status == 200 for r in window)


def test_a_probe_shorter_than_the_stall_readmits_the_stalling_consumer() -> None:
    result = _run(probe_decode_tokens=2)
    readmitted = {d["engine"] for d in _decisions(result, "readmit")}
    assert STALLING in readmitted and not readmitted & {HUNG, EMPTYING}
