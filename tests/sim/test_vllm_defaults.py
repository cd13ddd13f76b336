"""vLLM's defaults by GPU and model (narwhal.sim.vllm_defaults), at their exact boundaries."""

from __future__ import annotations

import pytest

from narwhal.sim.model_shape import model_shape
from narwhal.sim.scenario import FleetSettings
from narwhal.sim.timing import load_profile
from narwhal.sim.vllm_defaults import (
    CUDAGRAPH_BYTES_ESTIMATE,
    GIB,
    NON_TORCH_BYTES_ESTIMATE,
    BatchDefaults,
    batch_defaults,
    kv_cache_budget,
)


def test_the_70_gib_rule_at_its_boundary() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert batch_defaults(69 * GIB, h100) == BatchDefaults(256, 2048)
    assert batch_defaults(70 * GIB - 1, h100) == BatchDefaults(256, 2048)
    assert batch_defaults(70 * GIB, h100) == BatchDefaults(1024, 8192)
    assert batch_defaults(70 * GIB, h100, "llm_class") == BatchDefaults(1024, 16384)
    assert batch_defaults(69 * GIB, h100, "llm_class") == BatchDefaults(256, 8192)
    # an A100 80GB stays on the small defaults (vLLM PR #17885), whatever its memory
    assert batch_defaults(80 * GIB, "NVIDIA A100-SXM4-80GB") == BatchDefaults(256, 2048)


def test_the_160_gib_tier_and_what_a_scenario_sets() -> None:
    assert batch_defaults(160 * GIB - 1, "NVIDIA H200") == BatchDefaults(1024, 8192)
    assert batch_defaults(160 * GIB, "NVIDIA B200") == BatchDefaults(1024, 16384)
    # a given budget caps a defaulted sequence cap; a given cap is kept as it is
    assert batch_defaults(141 * GIB, "NVIDIA H200", max_num_batched_tokens=512) == BatchDefaults(
        512, 512
    )
    assert batch_defaults(141 * GIB, "NVIDIA H200", max_num_seqs=64) == BatchDefaults(64, 8192)


def test_scenario_gets_the_defaults_of_its_gpu_memory() -> None:
    below = FleetSettings(prefill=1, decode=1, gpu_memory_gb=69 * GIB / 1e9)
    at = FleetSettings(prefill=1, decode=1, gpu_memory_gb=70 * GIB / 1e9)
    assert (below.engine_params().max_num_seqs, below.engine_params().max_num_batched_tokens) == (
        256,
        2048,
    )
    assert (at.engine_params().max_num_seqs, at.engine_params().max_num_batched_tokens) == (
        1024,
        8192,
    )
    assert at.vllm_notes() == []


def test_a_departure_gets_a_note() -> None:
    fleet = FleetSettings(prefill=1, decode=1, max_num_seqs=256, max_num_batched_tokens=2048)
    assert fleet.vllm_notes() == [
        "max_num_seqs 256 departs from vLLM's default 1024 on NVIDIA H200",
        "max_num_batched_tokens 2048 departs from vLLM's default 8192 on NVIDIA H200",
    ]
    same = FleetSettings(prefill=1, decode=1, max_num_seqs=1024, gpu_memory_utilization=0.92)
    assert same.vllm_notes() == []
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8192\) must be >= max_num_"):
        FleetSettings(prefill=1, decode=1, max_num_seqs=9000)


def test_model_shapes_match_the_profile_kv_bytes() -> None:
    for name, entry in load_profile()["models"].items():
        shape = model_shape(name)
        all_shards = entry["kv_bytes_per_token_all_shards"]
        assert shape.kv_bytes_per_token_per_rank * shape.tp == all_shards
    small = model_shape("llama3-8b")
    # Llama-3-8B: 32 x (4096 x 128 x (64 + 16) + 3 x 4096 x 14336) + 2 x 128256 x 4096 params
    assert small.weight_bytes_per_rank == 2 * (32 * (41_943_040 + 176_160_768) + 1_050_673_152)


def test_kv_sizing_arithmetic_on_llama3_8b_h200() -> None:
    budget = kv_cache_budget(model_shape("llama3-8b"), 141_000_000_000, 0.92, 16, 2048, 256)
    requested = 129_720_000_000  # ceil(141e9 x 0.92)
    weights = 16_059_990_016
    # the sampler phase dominates: 256 rows x 128256 logits x 10 bytes > 2048 x 51200 x 2 bytes
    activation = 256 * 128_256 * 10
    assert (budget.requested, budget.weights, budget.activation_peak) == (
        requested,
        weights,
        activation,
    )
    estimates = NON_TORCH_BYTES_ESTIMATE + CUDAGRAPH_BYTES_ESTIMATE
    available = requested - weights - activation - estimates
    assert budget.available == available == 111_721_061_888
    assert budget.bytes_per_block == 16 * 131_072
    assert budget.num_blocks == 53_272  # floor(111,721,061,888 / 2,097,152)
    fleet = FleetSettings(prefill=1, decode=1, max_num_seqs=256, max_num_batched_tokens=2048)
    assert fleet.engine_params().num_blocks == 53_272


def test_tp4_sizing_is_per_rank() -> None:
    shape = model_shape("llama3-70b-tp4")
    assert shape.kv_bytes_per_token_per_rank == 2 * 80 * 2 * 128 * 2  # 2 of 8 KV heads per rank
    budget = kv_cache_budget(shape, 141_000_000_000, 0.92, 16, 8192, 1024)
    # 70.55e9 params / 4 ranks in bf16; at 1024 sequences the sampler's 1024 x 128256 x 10 bytes
    # outweighs the forward's 8192 x (2 x 8192 + 3 x 28672 / 4) x 2
    params = 80 * (8192 * 128 * 144 + 3 * 8192 * 28672) + 2 * 128256 * 8192
    assert budget.weights == 2 * params // 4
    assert budget.activation_peak == 1024 * 128_256 * 10 > 8192 * (2 * 8192 + 21504) * 2
    assert budget.num_blocks == budget.available // (16 * 81_920) == 69_824
