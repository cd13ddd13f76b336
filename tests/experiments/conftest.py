"""Helpers for the sweep tests: a tiny scenario and spec written to a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"

TINY_SCENARIO = """
name = "tiny"
[engine]
first_token_timeout_s = 1.0
decode_read_timeout_s = 0.5
request_timeout_s = 10.0
max_handoff_age_s = 3.0
[recovery]
eject_after = 3
max_attempts = 2
probe_interval_s = 1.0
[fleet]
prefill = 1
decode = 2
model = "llama3-8b"
stream_interval = 8
[workload]
kind = "poisson"
rate = 20.0
duration_s = 2.0
prompt = { dist = "uniform", low = 100, high = 400 }
output = { dist = "uniform", low = 10, high = 40 }
[sim]
decision_log = false
sample_interval_s = 5.0
[[faults]]
kind = "hang"
role = "decode"
count = 1
at_s = 1.0
duration_s = 1.5
[[faults]]
kind = "inband_error"
role = "decode"
rate_per_hour = 3600.0
duration_s = 1.0
probability = 0.3
"""

TINY_SPEC = """
[sweep]
name = "tiny"
scenario = "tiny.toml"
seed = 7
replicates = 2
recipe = "tuning"
[grid]
"recovery.eject_after" = [1, 3]
"recovery.failure_quarantine_s" = [0.0, 2.0]
[goodput]
rate_multipliers = [1.0, 2.0]
report_at = 1.0
"""


@pytest.fixture
def tiny_spec(tmp_path: Path) -> Path:
    (tmp_path / "tiny.toml").write_text(TINY_SCENARIO, "utf-8")
    spec = tmp_path / "tiny-sweep.toml"
    spec.write_text(TINY_SPEC, "utf-8")
    return spec
