"""Tensor parallelism in the step model: the all-reduces a TP > 1 engine adds to every step.

Rule kept here: a Llama-shaped model split over ``tp`` ranks (Megatron-style, as vLLM's
``RowParallelLinear`` does) all-reduces its activations twice per layer, after the attention
output projection and after the MLP down projection, each of ``batch_tokens x hidden x dtype``
bytes. A ring all-reduce of ``n`` bytes over ``tp`` ranks takes ``latency + 2(tp-1)/tp x n /
bandwidth`` (NCCL's bus-bandwidth convention, ``nccl-tests`` ``doc/PERFORMANCE.md``). The step
time of a TP > 1 engine is the one-shard step the profile measured plus those all-reduces, with
no overlap of communication and compute; TP = 1 adds nothing (the shard's model is returned
unchanged).

Theory of operation: the per-step cost is linear in the batch's tokens, so it is folded once
into two numbers, ``fixed_s = 2 x layers x latency`` and ``per_token_s = 2 x layers x 2(tp-1)/tp
x hidden x dtype / bandwidth``, and :class:`TensorParallelStep` adds ``fixed_s + per_token_s x
tokens`` to the shard's :meth:`~narwhal.sim.timing.StepModel.batch_s`. The bandwidth and latency
are stated parameters (``[fleet] tp_allreduce_gbps``, ``tp_allreduce_latency_us``); their
defaults are estimates for NVLink 4 on an H200 (see ``NVLINK_H200_*``) until measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.sim.model_shape import ModelShape
from narwhal.sim.timing import StepTiming

# Estimates, not measurements. NVIDIA's H200 datasheet gives NVLink 4 at 900 GB/s per GPU (both
# directions: 450 GB/s each way); NCCL all-reduce on HGX H100/H200 reaches roughly 80% of that as
# bus bandwidth in nccl-tests, hence 360 GB/s. The latency is that of a small all-reduce (vLLM's
# custom all-reduce over NVLink for small messages is a few microseconds; NCCL's ring about 10).
NVLINK_H200_BUS_GBPS = 360.0
NVLINK_H200_LATENCY_US = 8.0
ALLREDUCES_PER_LAYER = 2  # attention output, MLP output


def allreduce_s(nbytes: float, tp: int, bandwidth_gbps: float, latency_s: float) -> float:
    """Time of one ring all-reduce of ``nbytes`` over ``tp`` ranks (0 when ``tp`` is 1)."""
    if tp <= 1:
        return 0.0
    return latency_s + 2.0 * (tp - 1) / tp * nbytes / (bandwidth_gbps * 1e9)


@dataclass(frozen=True)
class TensorParallelStep:
    """A one-shard step model plus the step's all-reduces (a :class:`StepTiming`)."""

    shard: StepTiming
    tp: int
    fixed_s: float  # all-reduce latencies of one step
    per_token_s: float  # all-reduce transfer time per batch token

    @property
    def kv_bytes_per_token(self) -> int:
        return self.shard.kv_bytes_per_token

    @property
    def reads_longest_context(self) -> bool:
        return self.shard.reads_longest_context

    def allreduce_step_s(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens

    def batch_s(
        self,
        decodes: int,
        prefill_tokens: int,
        decode_context: int,
        prefill_pairs: float,
        prefill_seqs: int = 0,
        longest_context: int = 0,
    ) -> float:
        shard = self.shard.batch_s(
            decodes, prefill_tokens, decode_context, prefill_pairs, prefill_seqs, longest_context
        )
        return shard + self.fixed_s + self.per_token_s * (decodes + prefill_tokens)


def with_allreduce(
    shard: StepTiming, shape: ModelShape, bandwidth_gbps: float, latency_s: float
) -> StepTiming:
    """``shard`` itself for TP = 1; otherwise ``shard`` plus two all-reduces per layer."""
    if shape.tp <= 1:
        return shard
    calls = ALLREDUCES_PER_LAYER * shape.layers
    per_token_bytes = shape.hidden * shape.dtype_bytes
    return TensorParallelStep(
        shard=shard,
        tp=shape.tp,
        fixed_s=calls * latency_s,
        per_token_s=calls * allreduce_s(per_token_bytes, shape.tp, bandwidth_gbps, 0.0),
    )
