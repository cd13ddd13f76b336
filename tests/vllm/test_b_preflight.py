"""``narwhal preflight`` against the real pair: passes as configured, fails with a clear reason
for each wrong pin (model, vLLM version, KV connector, the producer's KV side channel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from narwhal.vllm.router_config import VLLM_VERSION
from tests.vllm.conftest import Fleet
from tests.vllm.harness import MODEL, config_text, run_preflight

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

TRUE_CONTRACT = {"model": MODEL, "vllm_version": VLLM_VERSION, "kv_connector": "NixlConnector"}


def preflight(pair: Fleet, tmp_path: Path, **overrides: Any) -> tuple[int, str]:
    config = tmp_path / "narwhal.toml"
    config.write_text(config_text(pair.producer, pair.consumer, **overrides))
    done = run_preflight(config)
    output = done.stdout + done.stderr
    print(output)  # shown by pytest on failure (and with -s)
    return done.returncode, output


def failed_rows(output: str) -> list[str]:
    return [line for line in output.splitlines() if "  FAIL  " in line]


def test_preflight_passes_on_the_pair(pair: Fleet, tmp_path: Path) -> None:
    code, output = preflight(pair, tmp_path)
    assert code == 0, output
    assert not failed_rows(output), output
    assert f"{pair.producer.url} -> {pair.consumer.url}" in output
    assert "KV handoff decoded" in output


@pytest.mark.parametrize(
    ("case", "overrides", "reason"),
    [
        (
            "model",
            {"contract": {**TRUE_CONTRACT, "model": "not-the-model"}},
            "model 'not-the-model' not served (found ['tiny-llama'])",
        ),
        (
            "version",
            {"contract": {**TRUE_CONTRACT, "vllm_version": "0.31.9"}},
            f"version '{VLLM_VERSION}' != pinned '0.31.9'",
        ),
        (
            "connector",
            {"contract": {**TRUE_CONTRACT, "kv_connector": "MooncakeConnector"}},
            "(connector_mismatch): descriptor carries remote_block_ids, remote_host, remote_port,"
            " which MooncakeConnector does not use",
        ),
        (
            "side-channel",
            {"kv_endpoint": "127.0.0.1:1"},
            "(side_channel_mismatch): engine contract pins the producer's KV side channel to"
            " 127.0.0.1:1",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 15 else "",
)
def test_preflight_fails_with_the_reason(
    pair: Fleet, tmp_path: Path, case: str, overrides: dict[str, Any], reason: str
) -> None:
    code, output = preflight(pair, tmp_path, **overrides)
    assert code == 1, output
    rows = failed_rows(output)
    assert rows, output
    assert any(reason in row for row in rows), output
