"""(default run, no vLLM) The Narwhal config written for a pair (``narwhal.vllm.router_config``)
is one ``narwhal serve`` accepts, pins what it is told to, and is TOML whatever the strings."""

from __future__ import annotations

import tomllib
from pathlib import Path

from narwhal.core.config import parse_config
from narwhal.vllm.processes import EngineProcess, EngineSpec
from narwhal.vllm.router_config import VLLM_VERSION, narwhal_config
from tests.vllm.harness import config_text, fleet_config_text


def test_suite_config_is_a_valid_narwhal_config(tmp_path: Path) -> None:
    producer = EngineProcess(EngineSpec("p", tmp_path, 8100, "kv_producer", 5559), tmp_path / "p")
    consumer = EngineProcess(EngineSpec("c", tmp_path, 8200, "kv_consumer", 5560), tmp_path / "c")
    text = config_text(producer, consumer, engine={"max_handoff_age_s": 1.5})
    config = parse_config(tomllib.loads(text))
    assert config.engine.max_handoff_age_s == 1.5
    assert config.engine_contract is not None and config.engine_contract.model == "tiny-llama"
    assert [(e.url, e.role.value, e.kv_endpoint) for e in config.engines] == [
        ("http://127.0.0.1:8100", "prefill", "127.0.0.1:5559"),
        ("http://127.0.0.1:8200", "decode", None),
    ]


def test_the_true_contract_is_pinned_and_any_pin_can_be_overridden(tmp_path: Path) -> None:
    producer = EngineSpec("p", tmp_path, 8100, "kv_producer", 5559)
    consumer = EngineSpec("c", tmp_path, 8200, "kv_consumer", 5560)
    pinned = parse_config(tomllib.loads(narwhal_config(producer, consumer)))
    assert pinned.engine_contract is not None
    assert (pinned.engine_contract.model, pinned.engine_contract.vllm_version) == (
        "tiny-llama",
        VLLM_VERSION,
    )
    assert pinned.engines[0].kv_endpoint == "127.0.0.1:5559"
    quoted = 'a "quoted" \\ model'
    text = narwhal_config(
        producer,
        consumer,
        contract={"model": quoted, "vllm_version": "0.31.9"},
        kv_endpoint="",
    )
    data = tomllib.loads(text)
    assert data["engine_contract"] == {"model": quoted, "vllm_version": "0.31.9"}
    assert "kv_endpoint" not in data["engines"][0]  # an empty override pins nothing
    assert "engine" not in data and "recovery" not in data  # empty sections are left out


def test_a_fleet_config_pins_every_producer_and_carries_the_routing(tmp_path: Path) -> None:
    producers = [
        EngineProcess(EngineSpec(f"p{i}", tmp_path, 8100 + i, "kv_producer", 5559 + i), tmp_path)
        for i in range(2)
    ]
    consumer = EngineProcess(EngineSpec("c", tmp_path, 8200, "kv_consumer", 5570), tmp_path)
    text = fleet_config_text(producers, [consumer], routing={"prefill": "prefix_affinity"})
    config = parse_config(tomllib.loads(text))
    assert config.routing.prefill == "prefix_affinity" and config.routing.decode == "least_reserved"
    assert (
        config.engine_contract is not None and config.engine_contract.vllm_version == VLLM_VERSION
    )
    assert [(e.url, e.role.value, e.kv_endpoint) for e in config.engines] == [
        ("http://127.0.0.1:8100", "prefill", "127.0.0.1:5559"),
        ("http://127.0.0.1:8101", "prefill", "127.0.0.1:5560"),
        ("http://127.0.0.1:8200", "decode", None),
    ]
