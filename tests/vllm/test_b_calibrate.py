"""``python -m narwhal.vllm.calibrate`` against the real pair: it times real handoffs and fits
the linear engine timing. Only the tool's working is asserted, not the fit's accuracy: on a
2-core machine shared with other work the timings are too noisy for that (the report prints
each point's error)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.vllm.conftest import Fleet
from tests.vllm.harness import REPO

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


def test_calibrate_fits_the_pair(pair: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "calibration.json"
    done = subprocess.run(
        [sys.executable, "-m", "narwhal.vllm.calibrate", "--producer", pair.producer.url,
         "--consumer", pair.consumer.url, "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    linear = tomllib.loads(data["toml"])["fleet"]["linear"]
    assert set(linear) == {"overhead_s", "prefill_s_per_token", "decode_s_per_token",
                           "kv_s_per_token"}  # fmt: skip
    assert 1 / 5000 < linear["decode_s_per_token"] < 1 / 20  # 20..5000 tokens/s per stream
    assert linear["prefill_s_per_token"] >= 0 and linear["overhead_s"] >= 0
    assert len(data["samples"]) == 25
    assert [p["prompt_tokens"] for p in data["points"]] == [17, 129, 385, 769, 1281]
    assert all(p["prefill_s"] > 0 and p["first_token_s"] > 0 for p in data["points"])
