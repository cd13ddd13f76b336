"""A closed workload on the simulated engine, recorded step by step as the real vLLM's is
(:mod:`tests.vllm.schedule_trace`): the simulator's side of the scheduler parity check.

Every request is opened at simulated time 0, before the engine's first step (the engine plans a
step from an event at the current time, after everything already scheduled then; the record
checks that the first step saw them all), with a prompt of token ids and ``max_tokens``; each
stream is read to its end. The scheduler's ``plan`` and ``_requeue`` are observed (the real
ones run, and the record reads what they did): per step, the tokens scheduled for each request
(each decode one, each prefill its chunk) and the requests preempted while composing it.
"""

from __future__ import annotations

import random
from typing import Any

import simpy

from narwhal.core.ports import Burst, StreamOpened
from narwhal.core.sse import EventKind, SseParser
from narwhal.sim.driver import SimTransport, start
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.gpu.sequence import Seq
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.timing import step_model

URL = "http://sim-e0"


def simulate(requests: list[tuple[int, int]], **params: Any) -> dict[str, Any]:
    """Run ``requests`` ((prompt tokens, output tokens) each) on one simulated engine with
    ``params`` (EngineParams fields); the record has ``steps``, ``outputs`` and ``preemptions``
    in :mod:`tests.vllm.schedule_trace`'s shape."""
    env = simpy.Environment()
    settings = {"model": "llama3-8b", "jitter": 0.0, "prefix_caching": False, **params}
    net = KvNetwork(env, bandwidth_gbps=40.0, setup_s=0.001)
    engine = SimEngine(
        env, URL, 0, EngineParams(**settings), step_model("llama3-8b"), net, {}, random.Random(1)
    )
    transport = SimTransport(env, {URL: engine})
    scheduler = engine.scheduler
    index: dict[int, int] = {}
    steps: list[dict[str, Any]] = []
    preempted: list[int] = []
    first_waiting: list[int] = []
    real_add, real_plan, real_requeue = scheduler.add, scheduler.plan, scheduler._requeue

    def add(seq: Seq) -> None:
        index[seq.id] = len(index)
        real_add(seq)

    def requeue(seq: Seq) -> None:
        preempted.append(index[seq.id])
        real_requeue(seq)

    def plan(step: int, now: float) -> Any:
        if not first_waiting:
            first_waiting.append(len(scheduler.waiting))
        planned = real_plan(step, now)
        if planned is not None:
            tokens = {index[seq.id]: 1 for seq in scheduler.decoding}
            for seq, take in planned[1]:
                tokens[index[seq.id]] = take
            steps.append({"tokens": tokens, "preempted": sorted(preempted)})
        preempted.clear()
        return planned

    scheduler.add, scheduler.plan, scheduler._requeue = add, plan, requeue  # type: ignore[method-assign]
    outputs = [0] * len(requests)
    for i, (prompt, out) in enumerate(requests):
        body = {"prompt": [10] * prompt, "max_tokens": out, "stream": True}
        start(env, _read(env, transport, body, outputs, i))
    env.run()
    assert first_waiting == [len(requests)], "the first step did not see every request"
    return {"steps": steps, "outputs": outputs, "preemptions": engine.totals.preemptions}


async def _read(
    env: simpy.Environment,
    transport: SimTransport,
    body: dict[str, Any],
    outputs: list[int],
    i: int,
) -> None:
    opened = await transport.open_stream(URL, "/v1/completions", body, {}, env.now + 1e6)
    assert isinstance(opened, StreamOpened) and opened.status == 200, opened
    parser = SseParser()
    while True:
        result = await transport.next_chunk(opened.handle, env.now + 1e6)
        assert isinstance(result, Burst), result
        for data in result.chunks:
            for event in parser.feed(data):
                if event.kind is EventKind.TOKEN:
                    outputs[i] += len(event.payload["choices"][0]["text"])  # type: ignore[index]
                elif event.kind is EventKind.DONE:
                    return
