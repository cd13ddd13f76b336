"""The GPUs the bundled profiles cover: the name the device reports and its total memory.

Rule kept here: vLLM picks its batch defaults and sizes its KV cache from what the device
reports (``torch.cuda.get_device_properties``: name, total memory), so a simulated GPU is those
two readings, each with where it was read. Each also carries the all-reduce
bandwidth and latency a tensor-parallel group of it gets (NCCL bus bandwidth): *estimates* from
the interconnect's nameplate, stated as such, except where a public calibration against NCCL
exists (the RTX PRO 6000's, from LLMServingSim), until a profile measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Gpu:
    key: str  # as profiles name it (LLMServingSim's hardware key)
    name: str  # as torch reports it
    memory_bytes: int  # total device memory as torch reports it
    source: str  # where the memory figure comes from
    allreduce_gbps: float  # estimate: NCCL all-reduce bus bandwidth between two of these
    allreduce_latency_us: float  # estimate: one small all-reduce


GPUS = {
    gpu.key: gpu
    for gpu in (
        # NVLink 4: 450 GB/s each way; NCCL reaches about 80% as bus bandwidth
        Gpu("H200", "NVIDIA H200", 141_000_000_000, "nameplate (141 GB HBM3e)", 360.0, 8.0),
        Gpu(
            "H100",
            "NVIDIA H100 80GB HBM3",
            round(79.11 * GIB),
            "79.11 GiB, the total capacity torch reports for an H100 80GB HBM3 (SXM) in a "
            "public vLLM out-of-memory log (vllm-project/vllm#27508)",
            # NVLink 4, as the H200
            360.0,
            8.0,
        ),
        Gpu(
            "A6000",
            "NVIDIA RTX A6000",
            round(47.54 * GIB),
            "47.54 GiB, the total_gpu_memory vLLM's memory profiling logs for an RTX A6000 (48 GB) "
            "in a public report (vllm-project/vllm#10360); torch names the device NVIDIA RTX A6000 "
            "(vllm-project/vllm#10451's collect_env)",
            # NVLink bridge between a pair: 112.5 GB/s both ways, 56.25 each way (LLMServingSim's
            # A6000 configs give link_bw 112); NCCL taken to reach about 80% as bus bandwidth
            45.0,
            10.0,
        ),
        Gpu(
            "RTX4090",
            "NVIDIA GeForce RTX 4090",
            25_250_627_584,
            "device_total_memory_bytes of LLMServingSim's RTX 4090 run (meta.json)",
            # PCIe 4.0 x16 (32 GB/s each way) without peer-to-peer: NCCL goes through host
            # memory, taken as a third of the link
            10.0,
            30.0,
        ),
        Gpu(
            "RTXPRO6000",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            round(95.5 * GIB),
            "95.5 GiB as torch reports the device in public run records (nameplate 96 GB)",
            # LLMServingSim's figures for this machine's GPU link (link_bw 16 GB/s, link_latency
            # 20 us per link in its bench/examples RTX PRO 6000 config.json), which its authors
            # state calibrate its ring all-reduce against real NCCL on this PCIe 5.0 machine
            # (serving/__main__.py, on the MoE all-gather size). A ring all-reduce over p ranks
            # crosses 2(p - 1) links (the alpha-beta ring model), so one all-reduce over the two
            # ranks its runs use pays two link latencies: 40 us
            16.0,
            2 * 20.0,
        ),
    )
}
