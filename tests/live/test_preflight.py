"""``narwhal preflight`` against emulated engines: passes on a good fleet, fails with a reason on
a wrong model, a wrong version, a wrong KV side channel or a dead engine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from narwhal.cli import main
from narwhal.core.config import parse_config
from narwhal.live.preflight import Check, format_table, run_preflight
from tests.live.conftest import Emulator, Servers, start_emulator

CONTRACT = {"model": "tiny-llama", "vllm_version": "0.32.0"}


def preflight(engines: list[dict[str, Any]], contract: dict[str, Any] | None = None) -> list[Check]:
    data: dict[str, Any] = {"engine": {"first_token_timeout_s": 1.0}, "engines": engines}
    if contract is not None:
        data["engine_contract"] = contract
    config = parse_config(data)
    return anyio.run(lambda: run_preflight(config))


@pytest.fixture(scope="module")
def engines(module_servers: Servers) -> list[dict[str, Any]]:
    """A producer, a consumer and a ``both`` engine, emulated, for the whole module."""
    producer, consumer, both = (
        start_emulator(module_servers, role) for role in ("prefill", "decode", "both")
    )
    return [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
        {"url": consumer.url, "role": "decode"},
        {"url": both.url, "role": "both", "kv_endpoint": both.side_channel},
    ]


@pytest.fixture
def fleet(engines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`engines` as a config's list, the test's own to change."""
    return [dict(engine) for engine in engines]


def test_good_fleet_passes_every_check(fleet: list[dict[str, Any]]) -> None:
    rows = preflight(fleet, CONTRACT)
    assert all(row.passed for row in rows), format_table(rows)
    pairs = [row.target for row in rows if row.check == "pair"]
    producer, consumer, both = (e["url"] for e in fleet)
    assert pairs == [f"{producer} -> {consumer}", f"{producer} -> {both}", f"{both} -> {consumer}"]


@pytest.mark.parametrize(
    ("contract", "reason"),
    [
        ({"model": "other-model", "vllm_version": "0.32.0"}, "model 'other-model' not served"),
        ({"model": "tiny-llama", "vllm_version": "0.31.0"}, "version '0.32.0' != pinned"),
    ],
)
def test_wrong_contract_fails(
    fleet: list[dict[str, Any]], contract: dict[str, Any], reason: str
) -> None:
    rows = preflight(fleet, contract)
    failed = [row for row in rows if not row.passed]
    assert failed and all(row.check != "contract" or reason in row.detail for row in failed)
    assert sum(row.check == "contract" for row in failed) == 3


def test_an_unreachable_engine_is_reported_as_such_with_a_contract(
    fleet: list[dict[str, Any]],
) -> None:
    fleet[1] = {**fleet[1], "url": "http://127.0.0.1:9"}  # nothing listens there
    rows = preflight(fleet, CONTRACT)
    contract = [r for r in rows if r.check == "contract" and r.target.startswith(fleet[1]["url"])]
    assert contract and not contract[0].passed
    assert contract[0].detail.startswith("unreachable"), contract[0].detail  # not "version None"


def test_wrong_side_channel_fails(fleet: list[dict[str, Any]]) -> None:
    fleet[0] = {**fleet[0], "kv_endpoint": "127.0.0.1:1"}
    rows = preflight(fleet, CONTRACT)
    failed = {row.target: row for row in rows if not row.passed}
    assert f"{fleet[0]['url']} (prefill)" in failed
    assert all("side_channel_mismatch" in row.detail for row in failed.values())
    assert len(failed) == 3  # the role check and both pairs from that producer


def test_decode_engine_listed_as_producer_fails(emulator: Callable[..., Emulator]) -> None:
    decoder, consumer = emulator("decode"), emulator("decode")
    rows = preflight(
        [{"url": decoder.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}]
    )
    role = next(r for r in rows if r.check == "role" and decoder.url in r.target)
    assert not role.passed and "not_an_object" in role.detail


def test_cli_exit_codes(
    fleet: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def toml(engines: list[dict[str, Any]], version: str) -> Path:
        lines = [
            "[engine]",
            "first_token_timeout_s = 1.0",
            "[engine_contract]",
            'model = "tiny-llama"',
            f'vllm_version = "{version}"',
        ]
        for engine in engines:
            lines.append("[[engines]]")
            lines += [f'{k} = "{v}"' for k, v in engine.items()]
        path = tmp_path / f"fleet-{version}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "narwhal.cli", "preflight", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )

    good = run(toml(fleet, "0.32.0"))  # the process's own exit status
    assert good.returncode == 0, good.stdout + good.stderr
    assert "9/9 checks passed" in good.stdout
    # the other statuses from the same entry point, in this process (what the process exits with)
    assert main(["preflight", "--config", str(toml(fleet, "9.9.9"))]) == 1
    assert "FAIL" in capsys.readouterr().out
    broken = tmp_path / "broken.toml"
    broken.write_text("[engine]\nfirst_token_timeout_s = -1\n")
    assert main(["preflight", "--config", str(broken)]) == 2
    assert "first_token_timeout_s" in capsys.readouterr().err
