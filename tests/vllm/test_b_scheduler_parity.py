"""Scheduler parity on the real CPU vLLM: the recorded schedules (tests/parity/data) are what
vLLM 0.32.0's scheduler does now, and the simulated engine schedules the same.

One process runs every case (:mod:`tests.vllm.schedule_trace`: vLLM's offline engine with its
core in-process, all requests added before the first step, so the record is independent of
this machine's speed). ``NARWHAL_RECORD_SCHEDULES=1`` rewrites the recorded file instead of
comparing with it (after a vLLM upgrade; the default suite then checks the simulator against
the new record).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.parity.schedules import DATA, cases, metrics_from_steps, simulated, vllm_steps
from tests.vllm.conftest import VENV

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]
ROOT = Path(__file__).resolve().parents[2]


def test_real_vllm_schedules_the_recorded_steps_and_the_sim_agrees(model_dir: Path) -> None:
    recorded = cases()
    jobs = [
        {"model": str(model_dir), "engine": c["engine"], "requests": c["requests"]}
        for c in recorded
    ]
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-m", "tests.vllm.schedule_trace"],
        input=json.dumps(jobs),
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(done.stdout.strip().splitlines()[-1])
    if os.environ.get("NARWHAL_RECORD_SCHEDULES") == "1":
        fresh = [dict(c, vllm=r) for c, r in zip(recorded, records, strict=True)]
        DATA.write_text(json.dumps(fresh, separators=(",", ":")))
        recorded = fresh
    for case, record in zip(recorded, records, strict=True):
        assert not record["async_scheduling"]  # the CPU engine's; the steps assume it
        assert vllm_steps(record) == vllm_steps(case["vllm"])
        assert record["outputs"] == [out for _, out in case["requests"]]
        assert metrics_from_steps(case, vllm_steps(record)) == record["metrics"]
        sim = simulated(dict(case, vllm=record))
        assert [(s["tokens"], s["preempted"]) for s in sim["steps"]] == vllm_steps(record)
