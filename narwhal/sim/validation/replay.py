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
from narwhal.sim.model_shape import ModelShape
from narwhal.sim.profiles import store
from narwhal.sim.profiles.gpus import GPUS
from narwhal.sim.profiles.opstep import capture_sizes
from narwhal.sim.profiles.source import ProfileError
from narwhal.sim.tensor_parallel import with_allreduce
from narwhal.sim.timing import StepTiming
from narwhal.sim.validation.runlog import RunLog, time_per_output_token
from narwhal.sim.vllm_defaults import kv_cache_budget


@dataclass(frozen=True)
class Timed:
    """One replayed request's timing, measured as the run measured it."""

    ttft_s: float
    latency_s: float
    output: int

    @property
    def tpot_s(self) -> float | None:
        return time_per_output_token(self.ttft_s, self.latency_s, self.output)


def num_blocks(run: RunLog, shape: ModelShape) -> int:
    """The run's KV blocks: as recorded, else vLLM's sizing on the run's GPU."""
    engine = run.engine
    if engine.num_gpu_blocks:
        return int(engine.num_gpu_blocks)
    memory = engine.gpu_memory_bytes or (GPUS[run.gpu].memory_bytes if run.gpu in GPUS else None)
    if memory is None:
        raise ProfileError(
            f"{run.path}: meta.json records neither kv_cache.num_gpu_blocks nor the device's "
            f"memory, and GPU {run.gpu!r} is not one of {', '.join(sorted(GPUS))}"
        )
    budget = kv_cache_budget(
        shape,
        int(memory),
        engine.gpu_memory_utilization,
        engine.block_size,
        engine.max_num_batched_tokens,
        engine.max_num_seqs,
    )
    return budget.num_blocks


def engine_timing(
    run: RunLog, profile: dict[str, Any], allreduce: bool = True
) -> tuple[EngineParams, StepTiming]:
    """The engine settings and the step timing that replay ``run`` with ``profile``
    (``allreduce``: a TP > 1 engine's all-reduces, on by default; off to measure their share)."""
    engine = run.engine
    config = store.model_config(profile)
    shape = config.shape(engine.tensor_parallel)
    timing: StepTiming
    if engine.enforce_eager:
        graphs: tuple[int, ...] = ()
    else:
        graphs = engine.capture_sizes or capture_sizes(engine.max_num_seqs)
    timing = store.timing(profile, engine.tensor_parallel, graphs)
    if allreduce and run.gpu in GPUS and shape.tp > 1:
        link = GPUS[run.gpu]
        timing = with_allreduce(timing, shape, link.allreduce_gbps, link.allreduce_latency_us / 1e6)
    params = EngineParams(
        model=engine.model,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        block_size=engine.block_size,
        num_blocks=num_blocks(run, shape),
        step_overhead_s=0.0,
        jitter=0.0,
        prefix_caching=engine.prefix_caching,
    )
    return params, timing


def replay(
    run: RunLog, profile: dict[str, Any], seed: int = 0, allreduce: bool = True
) -> list[Timed]:
    """Simulate ``run`` with ``profile``; the timing of each request, in the run's order."""
    if run.cluster.disaggregated:
        return _through_router(run, profile, seed, allreduce)
    params, timing = engine_timing(run, profile, allreduce)
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
        stamps = [t for t, data in stream.buffer if data is not DONE and data != DONE]
        if not stamps or stream.ended is None:
            raise ProfileError(f"request {i} did not finish in the replay")
        out.append(
            Timed(stamps[0] - request.arrival_s, stamps[-1] - request.arrival_s, request.output)
        )
    return out


NEVER_S = 86_400.0  # router timeouts a replay must not hit: the run had no such router


def _through_router(
    run: RunLog, profile: dict[str, Any], seed: int, allreduce: bool
) -> list[Timed]:
    """A disaggregated run through Narwhal's simulated router (see the module docstring)."""
    import tempfile
    from pathlib import Path

    from narwhal.sim.results import record_rows
    from narwhal.sim.runner import run as simulate
    from narwhal.sim.scenario import parse_scenario

    cluster, engine = run.cluster, run.engine
    if not cluster.prefill or not cluster.decode:
        raise ProfileError(f"{run.path}: a disaggregated run needs prefill and decode engines")
    shape = store.model_config(profile).shape(engine.tensor_parallel)
    fleet: dict[str, Any] = {
        "gpu": run.gpu,
        "model": engine.model,
        "prefill": cluster.prefill,
        "decode": cluster.decode,
        "both": cluster.colocated,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "block_size": engine.block_size,
        "kv_cache_tokens": num_blocks(run, shape) * engine.block_size,
        "tensor_parallel": engine.tensor_parallel,
        "cuda_graphs": not engine.enforce_eager,
        "prefix_caching": engine.prefix_caching,
        "tp_allreduce": allreduce,
        "step_overhead_ms": 0.0,
        "jitter": 0.0,
    }
    if cluster.link_gbps is not None:
        fleet["link_bandwidth_gbps"] = cluster.link_gbps
    if cluster.link_latency_s is not None:
        fleet["link_setup_ms"] = cluster.link_latency_s * 1e3
    if run.gpu not in GPUS:
        raise ProfileError(f"{run.path}: GPU {run.gpu!r} is not one of {', '.join(sorted(GPUS))}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profile.json.gz"
        store.write(profile, path)
        fleet["profile"] = str(path)
        scenario = parse_scenario(
            {
                "fleet": fleet,
                "workload": {"kind": "run", "run": str(run.path)},
                "engine": {
                    "first_token_timeout_s": NEVER_S,
                    "decode_read_timeout_s": NEVER_S,
                    "request_timeout_s": NEVER_S,
                },
                "sim": {"seed": seed, "decision_log": False},
            },
            f"replay of {run.path}",
        )
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
