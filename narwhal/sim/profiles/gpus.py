"""The GPUs the bundled profiles cover: the name the device reports and its total memory.

Rule kept here: vLLM picks its batch defaults and sizes its KV cache from what the device
reports (``torch.cuda.get_device_properties``: name, total memory), so a simulated GPU is those
two readings, each with where it was read. A GPU not listed here is simulated only with
``[fleet] gpu_name`` and ``gpu_memory_gb`` given.
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


GPUS = {
    gpu.key: gpu
    for gpu in (
        Gpu("H200", "NVIDIA H200", 141_000_000_000, "nameplate (141 GB HBM3e)"),
        Gpu(
            "RTX4090",
            "NVIDIA GeForce RTX 4090",
            25_250_627_584,
            "device_total_memory_bytes of LLMServingSim's RTX 4090 run (meta.json)",
        ),
        Gpu(
            "RTXPRO6000",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            round(95.5 * GIB),
            "95.5 GiB as torch reports the device in public run records (nameplate 96 GB)",
        ),
    )
}


def gpu(key: str) -> Gpu:
    """The GPU named ``key``, or a ValueError listing the ones known."""
    try:
        return GPUS[key]
    except KeyError:
        raise ValueError(f"unknown gpu {key!r}; known: {', '.join(sorted(GPUS))}") from None
