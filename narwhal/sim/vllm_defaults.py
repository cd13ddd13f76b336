"""vLLM's own engine defaults for a GPU and a model, as the pinned vLLM (0.32.0) computes them.

Rule kept here: a simulated engine that a scenario does not configure gets the sequence cap, the
token budget and the KV-cache size a real vLLM would pick on that GPU for that model; each rule is
a transcription of vLLM's arithmetic (source named at each function), not a tuned number. Where
vLLM measures rather than computes (the activation peak and the memory outside PyTorch, both from
a profiling run on the device), the value here is an estimate, named as one, with its derivation.

Theory of operation. :func:`batch_defaults` is ``EngineArgs.get_batch_defaults`` plus
``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`` (``vllm/engine/arg_utils.py``):
the device's total memory and name pick a tier (>= 160 GiB; >= 70 GiB and not an A100; the
rest), the usage context (``vllm serve`` is the API server, ``LLM(...)`` the LLM class) picks the
pair in it, and an unset sequence cap is then capped by the token budget. :func:`kv_cache_budget`
is ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``) with
``request_memory`` (``vllm/v1/worker/utils.py``) and ``get_kv_cache_config_from_groups``
(``vllm/v1/core/kv_cache_utils.py``): ``ceil(total x gpu_memory_utilization)`` minus weights,
the activation peak of the profile run, the non-torch memory and the CUDA-graph estimate, divided
into blocks of ``block_size x`` per-token KV bytes of one tensor-parallel rank.
:func:`departures` names each setting a scenario gives that differs from these defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from narwhal.sim.model_shape import ModelShape

GIB = 1 << 30
UsageContext = Literal["api_server", "llm_class"]

# vLLM 0.32.0 CacheConfig.gpu_memory_utilization (vllm/config/cache.py)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

# Estimates for what vLLM measures on the device (see kv_cache_budget):
# CUDA context, cuBLAS/NCCL workspaces and buffers outside PyTorch's allocator, per rank
NON_TORCH_BYTES_ESTIMATE = 1 * GIB
# memory of the captured CUDA graphs (profile_cudagraph_memory, on by default in 0.32.0)
CUDAGRAPH_BYTES_ESTIMATE = GIB // 2
# the sampler's buffers per vocabulary entry per sequence: bf16 logits, their fp32 copy, fp32
# probabilities (FlashInfer samples from probabilities), i.e. 2 + 4 + 4 bytes
SAMPLER_BYTES_PER_LOGIT = 10


@dataclass(frozen=True)
class BatchDefaults:
    max_num_seqs: int
    max_num_batched_tokens: int


def batch_defaults(
    device_memory_bytes: int,
    device_name: str,
    usage_context: UsageContext = "api_server",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> BatchDefaults:
    """vLLM's sequence cap and token budget on a CUDA GPU (``vllm/engine/arg_utils.py``,
    ``EngineArgs.get_batch_defaults`` then ``_set_default_max_num_seqs_and_batched_tokens_args``),
    keeping whichever of the two the caller sets. Chunked prefill is on (vLLM's default for these
    models), so the budget is not raised to the context length; vLLM also caps a defaulted budget
    at ``max_num_seqs x max_model_len``, which no model here reaches."""
    api = usage_context == "api_server"
    if device_memory_bytes >= 160 * GIB:  # B200/B300 class
        seqs, tokens = 1024, 16384
    elif device_memory_bytes >= 70 * GIB and "a100" not in device_name.lower():  # H100/H200
        seqs, tokens = 1024, 8192 if api else 16384
    else:
        seqs, tokens = 256, 2048 if api else 8192
    budget = tokens if max_num_batched_tokens is None else max_num_batched_tokens
    if max_num_seqs is None:
        return BatchDefaults(min(seqs, budget), budget)
    return BatchDefaults(max_num_seqs, budget)


@dataclass(frozen=True)
class KvCacheBudget:
    """One rank's memory as vLLM divides it, in bytes, and the KV blocks that result."""

    requested: int  # ceil(total x gpu_memory_utilization)
    weights: int
    activation_peak: int  # estimate: see activation_peak_bytes
    non_torch: int  # estimate
    cudagraph: int  # estimate
    bytes_per_block: int  # block_size x KV bytes per token of one rank

    @property
    def available(self) -> int:
        """What is left for the KV cache (vLLM's ``available_kv_cache_memory_bytes``)."""
        non_kv = self.weights + self.activation_peak + self.non_torch + self.cudagraph
        return self.requested - non_kv

    @property
    def num_blocks(self) -> int:
        return max(0, self.available) // self.bytes_per_block


def activation_peak_bytes(shape: ModelShape, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Estimate of the transient peak of vLLM's profile run (``GPUModelRunner.profile_run``: one
    forward of ``max_num_batched_tokens`` tokens, then the sampler on ``min(max_num_seqs,
    tokens)`` rows). vLLM measures it (``torch_peak - torch_allocated``); the estimate takes the
    larger of the two phases' live tensors: in the MLP, the residual and normed hidden states
    (``2 x hidden``) and the gate-up output and its activation (``3 x intermediate / tp``) per
    token; in the sampler, ``SAMPLER_BYTES_PER_LOGIT`` per vocabulary entry per row."""
    tokens = max_num_batched_tokens
    forward = tokens * (2 * shape.hidden + 3 * shape.inter // shape.tp) * shape.dtype_bytes
    rows = min(max_num_seqs, tokens)
    sampler = rows * shape.vocab * SAMPLER_BYTES_PER_LOGIT
    return max(forward, sampler)


def kv_cache_budget(
    shape: ModelShape,
    gpu_memory_bytes: int,
    utilization: float,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> KvCacheBudget:
    """vLLM's KV blocks on one rank: ``Worker.determine_available_memory``
    (``vllm/v1/worker/gpu_worker.py``: requested - non-KV memory - CUDA-graph estimate), with
    ``request_memory`` (``vllm/v1/worker/utils.py``: ``ceil(total x utilization)``) and
    ``get_kv_cache_config_from_groups`` (``vllm/v1/core/kv_cache_utils.py``: ``available //
    bytes_per_block``). Every rank of a TP group holds the same number of blocks."""
    return KvCacheBudget(
        requested=math.ceil(gpu_memory_bytes * utilization),
        weights=shape.weight_bytes_per_rank,
        activation_peak=activation_peak_bytes(shape, max_num_batched_tokens, max_num_seqs),
        non_torch=NON_TORCH_BYTES_ESTIMATE,
        cudagraph=CUDAGRAPH_BYTES_ESTIMATE,
        bytes_per_block=block_size * shape.kv_bytes_per_token_per_rank,
    )


def departures(
    device_name: str,
    given: dict[str, float | int | None],
    defaults: dict[str, float | int],
) -> list[str]:
    """One note per setting the scenario gives that differs from vLLM's default, e.g.
    ``max_num_seqs 256 departs from vLLM's default 1024 on NVIDIA H200``."""
    notes = []
    for key, value in given.items():
        default = defaults[key]
        if value is not None and value != default:
            notes.append(
                f"{key} {value:g} departs from vLLM's default {default:g} on {device_name}"
            )
    return notes


# vLLM 0.14.0 made async scheduling the default (vllm-project/vllm#27614, in its release notes'
# breaking changes); pipeline parallelism on the V1 model runner still turns it off.
ASYNC_SCHEDULING_SINCE = (0, 14)


def async_scheduling_default(vllm_version: str, pipeline_parallel: int = 1) -> bool | None:
    """Whether a CUDA vLLM of ``vllm_version`` schedules asynchronously unless told otherwise;
    None when the version cannot be read (e.g. "not recorded")."""
    parts = vllm_version.strip().lstrip("v").split(".")
    try:
        version = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None
    return version >= ASYNC_SCHEDULING_SINCE and pipeline_parallel <= 1
