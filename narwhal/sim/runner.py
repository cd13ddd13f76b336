"""The runner: builds a simulated fleet from a scenario and runs the core against it.

Rule kept here: the runner wires, it does not decide. Requests enter by
:func:`narwhal.core.entry.admit_and_serve` (the router's admission bound) and are served by
:func:`narwhal.core.lifecycle.serve_request`; probes and health checks run in
:func:`narwhal.core.probe.maintenance_loop`; all unchanged, through the ports of
:mod:`narwhal.sim.driver`; the runner only feeds arrivals, flips faults and observes.

Theory of operation: one seed makes the run. It is split into independent RNGs (workload,
faults, one per engine, the router's policies), so changing one part never shifts another's
draws. Arrivals come from one SimPy process; each starts a task running ``admit_and_serve``, whose
record the core hands to ``policies.on_record``. A sampler process snapshots every
engine (router-side breaker state and reservations, engine-side condition and queues) every
``sim.sample_interval_s``. The run ends when the last request has its record (the maintenance
loop is then told to stop) or at ``sim.max_sim_s``: a request still running then has no record,
even if its coroutine, closed later by the garbage collector, hands one in. A streamed run
(``stream_to``) generates its arrivals as they come due (after a first pass that only counts
them, with a copy of the workload RNG, for the run's size and the faults' horizon) and hands each
record, sample and decision to a :class:`~narwhal.sim.streaming.StreamRecorder` as it is made.
:class:`RunResult` carries everything :mod:`narwhal.sim.results` needs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import simpy

from narwhal.core.entry import admit_and_serve
from narwhal.core.flow import FlowKey
from narwhal.core.lifecycle import serve_request
from narwhal.core.probe import maintenance_loop
from narwhal.core.records import DecisionLog, RequestRecord
from narwhal.core.requests import CHAT, COMPLETIONS, ClientRequest
from narwhal.sim.classes import ClassStats
from narwhal.sim.driver import SINK, make_ports, start
from narwhal.sim.faults import FaultSpec, FaultWindow, expand, install, past_the_end
from narwhal.sim.gpu.engine import SimEngine
from narwhal.sim.gpu.handoffs import Registry
from narwhal.sim.gpu.prefix import prompt_text
from narwhal.sim.kvevents import sim_block_chain, start_kv_events
from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.loadreports import start_load_reports
from narwhal.sim.replicas import RouterReplicas
from narwhal.sim.scenario import Scenario
from narwhal.sim.streaming import StreamRecorder
from narwhal.sim.timing import LinearStepTiming
from narwhal.sim.workload import Arrival, arrivals, generate, no_requests


@dataclass
class RunResult:
    """Everything one run produced (all of it a function of the scenario and the seed)."""

    scenario: Scenario
    seed: int
    arrivals: list[Arrival]
    records: list[RequestRecord]
    fault_windows: list[FaultWindow]
    samples: list[dict[str, Any]]
    conditions: list[dict[str, Any]]  # engine-side condition changes (faults)
    decisions: list[dict[str, Any]]
    engines: dict[str, dict[str, Any]]  # per-engine totals
    sim_end_s: float
    # tokens delivered before [DONE] per decode request id (the core's "<request>-d<attempt>-…")
    delivered: dict[str, int] = field(default_factory=dict)
    # which router replica served each request (empty with one replica: :mod:`.replicas`)
    replica_of: dict[str, int] = field(default_factory=dict)
    replica_ejections: list[int] = field(default_factory=list)  # per replica, with several
    wall_s: float = field(default=0.0, compare=False)  # not part of the written results
    policy_seed: int = 0  # the router's seed (``Policies(seed=...)``) derived from ``seed``
    # scheduled faults the run ended before (they never happened: callers warn about them)
    unrun_faults: list[FaultSpec] = field(default_factory=list)
    requests: int = 0  # arrivals in the run (finished or not)
    finished: int = 0  # requests with a record
    first_arrival_s: float = 0.0
    last_arrival_s: float = 0.0
    # a streamed run (``run(..., stream_to=DIR)``): records, samples and decisions are in its
    # files, not in this object (``records``, ``arrivals``, ``samples``, ``decisions`` and
    # ``delivered`` are empty), and its counts are here
    streamed: StreamRecorder | None = field(default=None, compare=False)
    # [flow] enabled: per band, queued / dispatched / mean wait / refusals (replica 0's)
    flow: dict[str, Any] = field(default_factory=dict)


def run(
    scenario: Scenario,
    seed: int | None = None,
    *,
    log: DecisionLog | None = None,
    progress: Callable[[int, int], None] | None = None,
    stream_to: Path | None = None,
) -> RunResult:
    """Simulate ``scenario`` (with ``seed`` overriding ``[sim].seed``). ``progress``, if given,
    is called with (requests finished, requests in the run) as each request ends; it only
    watches, so the run is the same with or without it. With ``stream_to``, the run writes
    ``records.csv``, ``timeline.csv`` and ``decisions.jsonl`` there as it goes, generates its
    arrivals as they come due and keeps nothing of a request once it has finished, so its
    memory does not grow with its number of requests (:mod:`narwhal.sim.streaming`)."""
    wall_start = time.perf_counter()
    scenario = scenario.with_seed(seed)
    sim, fleet, config = scenario.sim, scenario.fleet, scenario.router
    root = random.Random(sim.seed)
    workload_rng = random.Random(root.getrandbits(64))
    fault_rng = random.Random(root.getrandbits(64))
    engine_seed = root.getrandbits(64)
    policy_seed = root.getrandbits(64)

    env = simpy.Environment()
    timing = fleet.step_timing()
    params = fleet.engine_params()
    if not sim.coalesce_reads:
        params = dataclasses.replace(params, coalesce_reads=False)
    if isinstance(timing, LinearStepTiming):  # the emulator's KV pull: kv_s_per_token x tokens
        net = KvNetwork(env, bandwidth_gbps=timing.link_bandwidth_gbps(), setup_s=timing.kv_setup_s)
    else:
        net = KvNetwork(
            env,
            bandwidth_gbps=fleet.link_bandwidth_gbps,
            setup_s=fleet.link_setup_ms / 1e3,
            topology=fleet.topology,
            ranks=fleet.shape().tp,  # each TP rank pulls its own shard (NIXL)
        )
    conditions: list[dict[str, Any]] = []

    def on_state(engine: SimEngine, state: str) -> None:
        conditions.append({"t": float(env.now), "engine": engine.url, "condition": state})

    registry: Registry = {}
    engines: dict[str, SimEngine] = {}
    for index, entry in enumerate(config.engines):
        rng = random.Random(f"{engine_seed}/{entry.url}")
        engines[entry.url] = SimEngine(
            env, entry.url, index, params, timing, net, registry, rng, on_state=on_state
        )

    log = log if log is not None else DecisionLog(enabled=sim.decision_log)
    records: list[RequestRecord] = []
    stopped = False  # the run is over: records handed in later are not the run's
    workload = scenario.workload
    kept: list[Arrival] = []  # every arrival, unless streamed
    if stream_to is None:
        kept = generate(workload, workload_rng)
        source: Iterator[Arrival] = iter(kept)
        total, first_t, last_t = len(kept), kept[0].t, kept[-1].t
    else:  # count them with a copy of the RNG, then make them again as they come due
        counting = random.Random()
        counting.setstate(workload_rng.getstate())
        total, first_t, last_t = 0, 0.0, 0.0
        for arrival in arrivals(workload, counting):
            if not total:
                first_t = arrival.t
            total, last_t = total + 1, arrival.t
        if not total:
            raise no_requests(workload)
        source = arrivals(workload, workload_rng)
    all_done = env.event()
    streamer = (
        StreamRecorder(
            stream_to,
            sim.slo_ttft_s,
            sim.slo_tpot_s,
            scenario.replicas.replicas,
            ClassStats(workload.classes, sim.slo_ttft_s, sim.slo_tpot_s)
            if workload.classes
            else None,
        )
        if stream_to is not None
        else None
    )
    finished = [0]  # requests with a record

    def on_record(record: RequestRecord) -> None:
        if stopped:  # a request the end of the run cut off, closed later (by the collector)
            return
        if streamer is None:
            records.append(record)
        else:
            replica = replicas.replica_of.pop(record.request_id, 0) if several else 0
            streamer.finish(record, replica)
        finished[0] += 1
        if progress is not None:
            progress(finished[0], total)
        if finished[0] == total and not all_done.triggered:
            all_done.succeed()

    if streamer is not None:
        for engine in engines.values():
            engine.totals.on_delivered = streamer.deliver

    replicas = RouterReplicas(
        scenario.replicas,
        config,
        seed=policy_seed,
        log=log,
        on_record=on_record,
        block_chain=sim_block_chain(params.block_size),
    )
    several = len(replicas.members) > 1
    if streamer is not None:
        for k, replica_log in enumerate(replicas.logs):
            replica_log.on_decision = streamer.decision_sink(k)
            replica_log.keep = 1  # what it adds is on disk
    start_kv_events(env, engines, replicas.members, sim.kv_event_delay_s)
    ports = make_ports(env, engines)
    horizon = last_t + config.engine.request_timeout_s
    roles = {e.url: e.role.value for e in config.engines}
    windows = expand(list(scenario.faults), roles, horizon, fault_rng)
    install(env, engines, windows)

    for policies in replicas.members:  # each replica probes and health-checks on its own
        start(
            env,
            maintenance_loop(
                ports,
                policies,
                stop=lambda: stopped,
                tick_s=sim.tick_s,
                health_checks=sim.health_checks,
            ),
        )
        start_load_reports(env, engines, policies)  # only for a least_loaded phase

    endpoint = CHAT if scenario.workload.endpoint == "chat" else COMPLETIONS
    stream = scenario.workload.stream
    model = fleet.model

    # where each class queues under [flow] (unused while flow control is off)
    plain_key = FlowKey(config.flow.default_priority, "", None)
    flow_keys = {c.name: FlowKey(c.priority, c.flow, c.slo_ttft_s) for c in workload.classes}
    upcoming: list[Arrival] = []  # the arrival feed() waits to start (taken from source)
    fed = [0]  # arrivals started

    def feed() -> Any:
        for i, arrival in enumerate(source):
            delay = arrival.t - env.now
            if delay > 0:
                upcoming.append(arrival)
                yield env.timeout(delay)
                upcoming.clear()
            fed[0] = i + 1
            if streamer is not None:
                streamer.start(i, arrival)
            # one token per character plus BOS; the content identity written in the text
            text = prompt_text(arrival.prompt, arrival.prefix, i)
            if endpoint == CHAT:
                body: dict[str, Any] = {
                    "model": model,
                    "max_tokens": arrival.output,
                    "messages": [{"role": "user", "content": text}],
                }
            else:
                body = {"model": model, "prompt": text, "max_tokens": arrival.output}
            body["stream"] = stream
            request = ClientRequest(f"req-{i}", endpoint, body, float(env.now))
            replica = replicas.route(request.request_id, i)
            serve = functools.partial(serve_request, request, ports, replica, SINK)
            key = flow_keys.get(arrival.cls, plain_key)
            start(
                env,
                admit_and_serve(
                    request.request_id, request.arrival, ports, replica, SINK, serve, key
                ),
            )

    samples: list[dict[str, Any]] = []
    first = replicas.members[0]

    def sample() -> Any:
        while True:
            now = float(env.now)
            for url, engine in engines.items():
                sample = {
                    "t": now,
                    "engine": url,
                    # replica 0's view; with several, ejected_by counts the replicas holding
                    # it out, and reservations are summed (what the engine holds)
                    "router_state": first.breaker.state(url, now).value,
                    "condition": engine.condition(),
                    "reserved_prefill": replicas.reserved(url, "prefill"),
                    "reserved_decode": replicas.reserved(url, "decode"),
                    **engine.load(),
                }
                if several:
                    sample["ejected_by"] = replicas.ejected_by(url, now)
                if streamer is None:
                    samples.append(sample)
                else:
                    streamer.sample(sample)
            yield env.timeout(sim.sample_interval_s)

    env.process(feed())
    env.process(sample())
    if total:
        env.run(until=env.any_of([all_done, env.timeout(sim.max_sim_s)]))
    stopped = True
    end = float(env.now)
    if streamer is not None:  # rows for the requests the end cut off, and those never started
        for replica_log in replicas.logs:  # a coroutine closed later adds nothing to the files
            replica_log.on_decision = None
        streamer.close(itertools.chain(upcoming, source), fed[0])
    windows = [w for w in windows if w.start < end]  # those past the end never happened
    unrun = past_the_end(list(scenario.faults), end)
    totals = {
        url: {
            "role": roles[url],
            "steps": e.totals.steps,
            "busy_s": e.totals.busy_s,
            "preemptions": e.totals.preemptions,
            "tokens_out": e.totals.tokens_out,
            "prefix_cache_queries": e.totals.prefix_cache_queries,
            "prefix_cache_hits": e.totals.prefix_cache_hits,
            "times_ejected": replicas.times_ejected(url),
        }
        for url, e in engines.items()
    }
    return RunResult(
        scenario=scenario,
        seed=sim.seed,
        arrivals=kept,
        records=records,
        fault_windows=windows,
        samples=samples,
        conditions=conditions,
        decisions=replicas.decisions() if streamer is None else [],
        engines=totals,
        sim_end_s=end,
        delivered={rid: n for e in engines.values() for rid, n in e.totals.delivered.items()},
        wall_s=time.perf_counter() - wall_start,
        policy_seed=policy_seed,
        unrun_faults=unrun,
        replica_of=replicas.replica_of,
        replica_ejections=[
            sum(p.breaker.health(url).times_ejected for url in engines) for p in replicas.members
        ]
        if several
        else [],
        requests=total,
        finished=finished[0],
        first_arrival_s=first_t,
        last_arrival_s=last_t,
        streamed=streamer,
        flow=first.flow.snapshot() if config.flow.enabled else {},
    )
