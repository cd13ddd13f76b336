"""The simulator runs the core's served-model decision as the live router does: a fleet whose
pinned contract names another model than its requests ask for answers each with vLLM's 404,
places nothing and charges nobody."""

from __future__ import annotations

from narwhal.sim.results import record_rows
from narwhal.sim.runner import run
from tests.sim.conftest import scenario

WORKLOAD = {"kind": "gamma", "rate": 5.0, "cv": 1.0, "duration_s": 2.0}


def test_requests_for_a_model_the_contract_does_not_serve_are_refused_unplaced() -> None:
    contract = {"model": "not-this-fleet", "vllm_version": "0.32.0"}
    result = run(scenario(workload=WORKLOAD, engine_contract=contract))
    rows = record_rows(result)
    assert rows and {(r["status"], r["outcome"], r["attempts"]) for r in rows} == {
        (404, "model_not_found", 0)
    }
    kinds = {d["kind"] for d in result.decisions}
    assert "place" not in kinds and "eject" not in kinds
    served = run(scenario(workload=WORKLOAD))  # the same requests, no contract: all served
    assert {r["status"] for r in record_rows(served)} == {200}
