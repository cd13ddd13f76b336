"""The engine's informational endpoints as vLLM serves them: ``/v1/models`` and ``/metrics``.

Rule kept here: what a router or a scraper reads about an engine has vLLM's shape and names —
the model list with ``max_model_len``, and Prometheus text with vLLM's metric names and labels
(``vllm:num_requests_running``, ``vllm:prompt_tokens_by_source_total`` by source,
``vllm:nixl_bytes_transferred``, ``vllm:prefix_cache_queries_total`` and ``_hits_total``, ...)
— computed from the engine's own counters.

Theory of operation: both are pure functions of the :class:`~narwhal.emulator.state.EngineState`
(``/metrics`` first sweeps expired handoffs, so the expiry counter is current). The load
gauges a router's ``least_loaded`` reads are the engine's true figures:
``vllm:num_requests_running`` the requests being served; ``vllm:num_requests_waiting`` 0, as
the emulator admits every request at once (it has no scheduler queue); and
``vllm:kv_cache_usage_perc`` from its KV model (:func:`kv_cache_usage`): a request being
served holds the blocks of its prompt and all its output tokens from its start, a producer's
handoff the blocks of its prompt until it is pulled, released or expired, out of
``kv_cache_tokens`` tokens of cache.
"""

from __future__ import annotations

import math
from typing import Any

from narwhal.emulator.state import EmulatorConfig, EngineState

METRICS_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


def models(config: EmulatorConfig) -> dict[str, Any]:
    """``GET /v1/models``: the one model served."""
    return {
        "object": "list",
        "data": [
            {
                "id": config.model,
                "object": "model",
                "created": 0,
                "owned_by": "vllm",
                "root": config.model,
                "parent": None,
                "max_model_len": config.max_model_len,
                "permission": [],
            }
        ],
    }


def kv_blocks(block_size: int, tokens: int) -> int:
    """The KV blocks that hold ``tokens`` tokens."""
    return math.ceil(tokens / block_size)


def kv_cache_usage(state: EngineState) -> float:
    """The share of the KV cache in use (0..1) by the module docstring's model."""
    config = state.config
    handoffs = sum(len(group) for e in state.kv.entries.values() for group in e.block_ids)
    used = state.running_kv_blocks + handoffs
    return min(1.0, used / kv_blocks(config.block_size, config.kv_cache_tokens))


def metrics(state: EngineState) -> str:
    """``GET /metrics``: Prometheus text with vLLM's names."""
    state.kv.sweep()
    config, c = state.config, state.counts
    labels = f'engine="0",model_name="{config.model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(state.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv_cache_usage(state)!r}",
        "# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.",
        "# TYPE vllm:prompt_tokens_by_source_total counter",
        f'vllm:prompt_tokens_by_source_total{{{labels},source="external_kv_transfer"}} '
        f"{float(c['external_kv_tokens'])}",
        f'vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} '
        f"{float(c['local_tokens'])}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {float(c['generation_tokens'])}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(c["completed"])}',
        "# HELP vllm:nixl_num_kv_expired_reqs_total Requests whose KV blocks expired.",
        "# TYPE vllm:nixl_num_kv_expired_reqs_total counter",
        f"vllm:nixl_num_kv_expired_reqs_total{{{labels}}} {float(state.kv.expired)}",
        "# HELP vllm:nixl_bytes_transferred Bytes transferred per NIXL transfer.",
        "# TYPE vllm:nixl_bytes_transferred histogram",
        f"vllm:nixl_bytes_transferred_sum{{{labels}}} {float(c['kv_bytes'])}",
        f"vllm:nixl_bytes_transferred_count{{{labels}}} {float(c['pulls_ok'])}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{config.block_size}",engine="0"}} 1.0',
        *state.prefix_cache.metric_lines(labels),
    ]
    return "\n".join(lines) + "\n"
