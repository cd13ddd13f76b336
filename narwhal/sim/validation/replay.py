"""Replaying a real run on simulated engines: the same requests, arrivals and engine settings.

Rule kept here: the replay changes nothing but the engine. Each request reaches the simulated
fleet when the real engine queued it, asks for the prompt and output lengths the real one served
(``ignore_eos``: exactly that many tokens), and is timed as the run was timed: first token and
last token against that arrival. The engines are configured from the run's settings
(:class:`~narwhal.sim.validation.runlog.EngineSetup`) and timed by the profile's operators
(:mod:`narwhal.sim.profiles.opstep`); no per-run constant enters. A colocated run (each engine
prefills and decodes its own requests) spreads its requests round robin over its engines; a
disaggregated run (prefill engines, decode engines) goes through Narwhal itself, as a
disaggregated deployment would: the router's simulated path places a one-token prefill, the
consumer pulls the KV over the run's link, then decodes.

Theory of operation: colocated, one SimPy environment, one
:class:`~narwhal.sim.gpu.engine.SimEngine` per engine, and a process that opens each request's
stream at its arrival; an engine stamps every chunk it writes with the simulated time, read once
the run has drained. Disaggregated, a scenario (``[fleet]`` from the run, ``[workload] kind =
"run"``, router timeouts that never fire) is run by :func:`narwhal.sim.runner.run` and its
records read back in arrival order (the first token the client got: ``first_byte_s``).
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import simpy

from narwhal.core.ports import StreamOpened
from narwhal.core.wire import DONE
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.handoffs import Registry
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.prefix import prompt_text
from narwhal.sim.gpu.sequence import SimStream
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.profiles.gpus import GPUS
from narwhal.sim.profiles.source import ProfileError
from narwhal.sim.scenario import Scenario, ScenarioError, parse_scenario
from narwhal.sim.timing import StepTiming
from narwhal.sim.validation.runlog import RunLog, time_per_output_token

NEVER_S = 86_400.0  # router timeouts a replay must not hit: the run had no such router


@dataclass(frozen=True)
class Timed:
    """One replayed request's timing, measured as the run measured it."""

    ttft_s: float
    latency_s: float
    output: int

    @property
    def tpot_s(self) -> float | None:
        return time_per_output_token(self.ttft_s, self.latency_s, self.output)


def run_allreduce(run: RunLog) -> tuple[float, float] | None:
    """A TP > 1 engine's all-reduce on a GPU Narwhal's catalogue does not hold, from the run's
    own link (``config.json``'s ``link_bw`` GB/s and ``link_latency`` per link): NCCL bus
    bandwidth ``link_bw`` and ``2 (tp - 1)`` link latencies, a ring's crossings (the rule the
    catalogue's RTX PRO 6000 entry applies to LLMServingSim's figures for that machine). None
    where the catalogue's estimate applies (a known GPU, or TP 1). (GB/s, latency in us)."""
    tp = run.engine.tensor_parallel
    if run.gpu in GPUS or tp <= 1:
        return None
    link, latency_s = run.cluster.link_gbps, run.cluster.link_latency_s
    if link is None:
        raise ProfileError(
            f"{run.path}: GPU {run.gpu!r} is not in Narwhal's catalogue "
            f"({', '.join(sorted(GPUS))}), so its TP {tp} all-reduce needs the run's link: "
            "link_bw (GB/s) and link_latency (ns) in the run's config.json"
        )
    return link, 2 * (tp - 1) * (latency_s or 0.0) * 1e6


def run_fleet(run: RunLog, allreduce: bool = True) -> dict[str, Any]:
    """The run's engines as a scenario's ``[fleet]`` table: its layout and recorded settings,
    the KV cache as recorded (else vLLM's sizing on the recorded or known device memory), no
    host overhead or noise (the profile's step is the whole step: vLLM's async scheduling
    overlaps the host's work with the GPU's). ``allreduce``: a TP > 1 engine's all-reduces
    (off to measure their share)."""
    cluster, engine = run.cluster, run.engine
    fleet: dict[str, Any] = {
        "gpu": run.gpu,
        "model": engine.model,
        "prefill": cluster.prefill,
        "decode": cluster.decode,
        "both": cluster.colocated,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "block_size": engine.block_size,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "tensor_parallel": engine.tensor_parallel,
        "cuda_graphs": not engine.enforce_eager,
        "prefix_caching": engine.prefix_caching,
        "async_scheduling": engine.async_scheduling,
        "tp_allreduce": allreduce,
        "step_overhead_ms": 0.0,
        "jitter": 0.0,
    }
    if engine.capture_sizes:
        fleet["cudagraph_capture_sizes"] = list(engine.capture_sizes)
    if engine.num_gpu_blocks:
        fleet["kv_cache_tokens"] = int(engine.num_gpu_blocks) * engine.block_size
    if engine.gpu_memory_bytes:
        fleet["gpu_memory_gb"] = int(engine.gpu_memory_bytes) / 1e9
    if engine.gpu_name:
        fleet["gpu_name"] = engine.gpu_name
    if run.gpu not in GPUS and (engine.gpu_name is None or engine.gpu_memory_bytes is None):
        raise ProfileError(
            f"{run.path}: GPU {run.gpu!r} is not in Narwhal's catalogue "
            f"({', '.join(sorted(GPUS))}), and meta.json's hardware does not record its "
            "device_name and device_total_memory_bytes (vLLM sizes its KV cache and picks its "
            "defaults from them)"
        )
    if (link := run_allreduce(run)) is not None:
        fleet["tp_allreduce_gbps"], fleet["tp_allreduce_latency_us"] = link
    if cluster.link_gbps is not None:
        fleet["link_bandwidth_gbps"] = cluster.link_gbps
    if cluster.link_latency_s is not None:
        fleet["link_setup_ms"] = cluster.link_latency_s * 1e3
    return fleet


def _scenario(run: RunLog, profile: dict[str, Any], seed: int, allreduce: bool) -> Scenario:
    """The scenario that replays ``run``: its fleet, its requests as the workload, router
    timeouts that never fire (the run had no such router)."""
    try:
        return parse_scenario(
            {
                "fleet": run_fleet(run, allreduce),
                "workload": {"kind": "run", "run": str(run.path)},
                "engine": {
                    "first_token_timeout_s": NEVER_S,
                    "decode_read_timeout_s": NEVER_S,
                    "request_timeout_s": NEVER_S,
                },
                "sim": {"seed": seed, "decision_log": False},
            },
            f"replay of {run.path}",
            profile,
        )
    except ScenarioError as error:
        raise ProfileError(str(error)) from None


def engine_timing(
    run: RunLog, profile: dict[str, Any], allreduce: bool = True
) -> tuple[EngineParams, StepTiming]:
    """The engine settings and the step timing that replay ``run`` with ``profile``."""
    fleet = _scenario(run, profile, 0, allreduce).fleet
    return fleet.engine_params(), fleet.step_timing()


def replay(
    run: RunLog, profile: dict[str, Any], seed: int = 0, allreduce: bool = True
) -> list[Timed]:
    """Simulate ``run`` with ``profile``; the timing of each request, in the run's order."""
    scenario = _scenario(run, profile, seed, allreduce)
    if run.cluster.disaggregated:
        return _through_router(run, scenario)
    params, timing = scenario.fleet.engine_params(), scenario.fleet.step_timing()
    env = simpy.Environment()
    registry: Registry = {}
    net = KvNetwork(env, bandwidth_gbps=1e9, setup_s=0.0)
    engines = [
        SimEngine(
            env,
            f"http://replay-{i}",
            i,
            params,
            timing,
            net,
            registry,
            random.Random(f"{seed}/{i}"),
        )
        for i in range(run.cluster.colocated)
    ]
    streams: list[SimStream | None] = [None] * len(run.requests)

    def arrivals() -> Generator[simpy.Event, object, None]:
        order = sorted(range(len(run.requests)), key=lambda i: run.requests[i].arrival_s)
        for i in order:
            request = run.requests[i]
            delay = request.arrival_s - env.now
            if delay > 0:
                yield env.timeout(delay)
            body = {
                "model": params.model,
                "prompt": prompt_text(request.prompt, request.segments, i),
                "max_tokens": request.output,
                "ignore_eos": True,
                "stream": True,
            }
            opened = engines[i % len(engines)].open_stream("/v1/completions", body, {})
            if not isinstance(opened, StreamOpened) or opened.handle is None:
                raise ProfileError(f"request {i} was refused by the simulated engine: {opened}")
            streams[i] = opened.handle

    env.process(arrivals())
    env.run()
    out = []
    for i, (request, stream) in enumerate(zip(run.requests, streams, strict=True)):
        assert stream is not None
        stamps = [t for t, data in stream.held() if data is not DONE and data != DONE]
        if not stamps or stream.ended is None:
            raise ProfileError(f"request {i} did not finish in the replay")
        out.append(
            Timed(stamps[0] - request.arrival_s, stamps[-1] - request.arrival_s, request.output)
        )
    return out


def _through_router(run: RunLog, scenario: Scenario) -> list[Timed]:
    """A disaggregated run through Narwhal's simulated router (see the module docstring)."""
    from narwhal.sim.results import record_rows
    from narwhal.sim.runner import run as simulate

    if not run.cluster.prefill or not run.cluster.decode:
        raise ProfileError(f"{run.path}: a disaggregated run needs prefill and decode engines")
    rows = record_rows(simulate(scenario))
    order = sorted(range(len(run.requests)), key=lambda i: run.requests[i].arrival_s)
    timed: list[Timed | None] = [None] * len(run.requests)
    for i, row in zip(order, rows, strict=True):
        if row["status"] != 200:
            raise ProfileError(f"request {i} failed in the replay: {row['outcome']}")
        timed[i] = Timed(
            float(row["first_byte_s"]), float(row["finished_s"]), run.requests[i].output
        )
    return [t for t in timed if t is not None]
