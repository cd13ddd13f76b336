"""The measured phases of benchmarks/router/routers.py: overhead (TTFT, throughput), fault goodput.

``phase_overhead`` runs every router at once against one shared producer and consumer: TTFT at
concurrency 1 with the targets interleaved request by request, then closed-loop throughput rounds
alternating between the targets (``measure`` one round: the router's process-group CPU read when
the measured window opens and closes, the consumer connections closed meanwhile; ``aggregate``
the rounds of one target). ``phase_faults`` gives each router a fresh fleet, turns three
consumers bad and SIGKILLs a producer under open-loop load, and classifies every response.
``Settings`` holds the sizes of a run (``--quick`` or full).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_report import pct
from bench_routers import router_spec, wait_router
from bench_stack import (
    MODEL,
    PROMPT_FILLER,
    LoadGen,
    Stack,
    group_cpu_seconds,
    start_fleet,
    time_wait,
)


@dataclass
class Settings:
    ttft_rounds: int
    ttft_warmup: int
    tput_rounds: int
    tput_seconds: float
    tput_concurrency: int
    tput_tokens: int
    req_seconds: float
    fault_rate: float
    fault_seconds: float
    fault_bound: float
    request_timeout: float
    kill_at: float

    @classmethod
    def make(cls, quick: bool) -> Settings:
        if quick:
            return cls(100, 10, 1, 3.0, 16, 64, 2.0, 10.0, 6.0, 15.0, 10.0, 2.0)
        return cls(400, 20, 3, 5.0, 16, 64, 4.0, 20.0, 15.0, 60.0, 30.0, 2.0)


def phase_overhead(
    stack: Stack, loadgen: LoadGen, names: list[str], cfg: Settings, workdir: Path
) -> dict[str, Any]:
    fleet = start_fleet(stack, "ovh", 1, 1)
    specs = [router_spec(name, fleet, workdir, cfg.request_timeout) for name in names]
    for spec in specs:
        stack.start(f"ovh-{spec.name}", spec.argv, router=True)
    for spec in specs:
        wait_router(spec, 60)
    prefill, decode = fleet.prefills[0].url, fleet.decodes[0].url
    fleet_port = fleet.decodes[0].port
    targets = [
        {"name": "direct", "kind": "direct", "url": decode},
        {"name": "direct-pd", "kind": "direct_pd", "prefill": prefill, "decode": decode},
    ] + [{"name": s.name, "kind": "router", "url": s.url} for s in specs]
    print(f"  TTFT: {cfg.ttft_rounds} interleaved rounds over {len(targets)} targets", flush=True)
    ttft = loadgen.run(
        {
            "cmd": "ttft",
            "targets": targets,
            "rounds": cfg.ttft_rounds,
            "warmup": cfg.ttft_warmup,
            "max_tokens": 16,
            "bound": 10.0,
        }
    )
    # two closed-loop workloads: long streams (per-chunk cost) and one-token requests
    # (per-request cost); rounds alternate between the targets
    workloads = (("streaming", cfg.tput_tokens, cfg.tput_seconds), ("requests", 1, cfg.req_seconds))
    tput: dict[str, dict[str, list[dict[str, Any]]]] = {w[0]: defaultdict(list) for w in workloads}
    for round_index in range(cfg.tput_rounds):
        for workload, tokens, seconds in workloads:
            for target in targets:
                if workload == "requests" and target["kind"] != "router":
                    continue
                result = measure(
                    stack, loadgen, target, cfg.tput_concurrency, seconds, tokens, fleet_port
                )
                tput[workload][target["name"]].append(result)
                print(
                    f"  {workload} round {round_index + 1} {target['name']}: "
                    f"{result['chunks'] / result['elapsed']:.0f} chunks/s, "
                    f"router CPU {result['router_cpu_s']:.2f} s",
                    flush=True,
                )
    for spec in specs:
        stack.stop(f"ovh-{spec.name}")
    for engine in fleet.prefills + fleet.decodes:
        stack.stop(engine.name)

    out: dict[str, Any] = {"ttft": {}}
    base = ttft["direct"]["ttft"]
    base_pd = ttft["direct-pd"]["ttft"]
    for name, data in ttft.items():
        values = data["ttft"]
        out["ttft"][name] = {
            "n": len(values),
            "outcomes": data["outcomes"],
            "p50_s": pct(values, 50),
            "p99_s": pct(values, 99),
            "mean_s": statistics.fmean(values) if values else None,
            "added_p50_s": _sub(pct(values, 50), pct(base, 50)),
            "added_p99_s": _sub(pct(values, 99), pct(base, 99)),
            "added_vs_pd_p50_s": _sub(pct(values, 50), pct(base_pd, 50)),
            "added_vs_pd_p99_s": _sub(pct(values, 99), pct(base_pd, 99)),
        }
    for workload, by_name in tput.items():
        out[workload] = {name: aggregate(rounds, name) for name, rounds in by_name.items()}
    out["flags"] = {s.name: " ".join(s.argv[1:]) for s in specs}
    out["names"] = names
    return out


def measure(
    stack: Stack,
    loadgen: LoadGen,
    target: dict[str, Any],
    concurrency: int,
    seconds: float,
    tokens: int,
    decode_port: int,
) -> dict[str, Any]:
    """One closed-loop run; the router's CPU time is read when the measured window opens/ends,
    and the connections to the consumer that were closed meanwhile are counted."""
    pgid = stack.procs[f"ovh-{target['name']}"].pid if target["kind"] == "router" else None
    marks: dict[str, float] = {}

    def sample(key: str) -> None:
        marks[key] = group_cpu_seconds(pgid) if pgid else 0.0
        marks[key + "_lg"] = group_cpu_seconds(loadgen.pgid)

    before = time_wait(decode_port)
    result: dict[str, Any] = loadgen.run(
        {
            "cmd": "throughput",
            "target": target,
            "concurrency": concurrency,
            "duration": seconds,
            "warmup": 0.5,
            "max_tokens": tokens,
            "bound": 30.0,
        },
        on_start=lambda: sample("start"),
        on_end=lambda: sample("end"),
    )
    result["decode_conns_closed"] = len(time_wait(decode_port) - before)
    result["router_cpu_s"] = marks["end"] - marks["start"]
    result["loadgen_cpu_s"] = marks["end_lg"] - marks["start_lg"]
    return result


def aggregate(rounds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    chunks = sum(r["chunks"] for r in rounds)
    elapsed = sum(r["elapsed"] for r in rounds)
    cpu = sum(r["router_cpu_s"] for r in rounds) if name != "direct" else 0.0
    outcomes: Counter[str] = Counter()
    for r in rounds:
        outcomes.update(r["outcomes"])
    ok = outcomes["ok"]
    ttfts = sorted(t for r in rounds for t in r.get("ttfts", []))
    return {
        "ttft_p50_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
        "chunks": chunks,
        "requests_ok": ok,
        "elapsed_s": elapsed,
        "chunks_per_s": chunks / elapsed if elapsed else None,
        "requests_per_s": ok / elapsed if elapsed else None,
        "router_cpu_s": cpu or None,
        "router_cores_busy": cpu / elapsed if cpu and elapsed else None,
        "chunks_per_cpu_s": chunks / cpu if cpu else None,
        "cpu_ms_per_1000_chunks": 1e6 * cpu / chunks if cpu and chunks else None,
        "cpu_ms_per_request": 1e3 * cpu / ok if cpu and ok else None,
        "loadgen_cpu_s": sum(r["loadgen_cpu_s"] for r in rounds),
        "decode_conns_closed_per_100_requests": 100.0
        * sum(r["decode_conns_closed"] for r in rounds)
        / max(1, sum(r["all_requests"] for r in rounds)),
        "outcomes": dict(outcomes),
        "rounds_chunks_per_cpu_s": [
            round(r["chunks"] / r["router_cpu_s"]) if r["router_cpu_s"] else None for r in rounds
        ],
    }


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


FAULTS = [
    ("hang_first_token", {"kind": "hang_first_token", "phase": "decode"}),
    ("stall_after_3", {"kind": "stall", "after_tokens": 3, "phase": "decode"}),
    ("early_done", {"kind": "early_done", "phase": "decode"}),
]


def phase_faults(
    stack: Stack, loadgen: LoadGen, name: str, cfg: Settings, workdir: Path
) -> dict[str, Any]:
    import httpx

    fleet = start_fleet(stack, f"flt-{name}", 2, 5)
    spec = router_spec(name, fleet, workdir, cfg.request_timeout)
    proc_name = f"flt-{name}-router"
    stack.start(proc_name, spec.argv, router=True)
    try:
        wait_router(spec, 60)
        for index in range(10):  # warm every pool a little
            body = {"model": MODEL, "prompt": f"{PROMPT_FILLER}[warm {index}]", "max_tokens": 4}
            httpx.post(spec.url + "/v1/completions", json=body, timeout=10)
        for engine, (_, fault) in zip(fleet.decodes, FAULTS, strict=False):
            reply = httpx.post(engine.url + "/admin/faults", json={"faults": [fault]}, timeout=5)
            reply.raise_for_status()
        victim = fleet.prefills[-1]
        timer = threading.Timer(cfg.kill_at, stack.kill, args=(victim.name,))
        total = int(cfg.fault_rate * cfg.fault_seconds)
        print(
            f"  {name}: {total} requests at {cfg.fault_rate:.0f}/s, bound {cfg.fault_bound:.0f} s",
            flush=True,
        )
        result = loadgen.run(
            {
                "cmd": "faults",
                "target": {"name": name, "kind": "router", "url": spec.url},
                "rate": cfg.fault_rate,
                "duration": cfg.fault_seconds,
                "bound": cfg.fault_bound,
                "max_tokens": 16,
            },
            on_start=timer.start,
        )
        timer.cancel()
        engines: dict[str, Any] = {}
        for engine, label in zip(
            fleet.decodes, [f[0] for f in FAULTS] + ["healthy"] * 5, strict=False
        ):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                state = httpx.get(engine.url + "/admin/state", timeout=5).json()
                engines[f"{engine.name} ({label})"] = {
                    k: state[k] for k in ("requests", "completed", "aborted", "running")
                }
        status = None
        if name == "narwhal":
            with contextlib.suppress(httpx.HTTPError, ValueError):
                status = httpx.get(spec.url + "/status", timeout=5).json()
    finally:
        stack.stop(proc_name)
        for engine in fleet.prefills + fleet.decodes:
            stack.stop(engine.name)
    records = result["records"]
    outcomes = Counter(r["outcome"] for r in records)
    latencies = [r["latency"] for r in records]
    ok_latencies = [r["latency"] for r in records if r["outcome"] == "ok"]
    details = Counter(
        f"{r['outcome']}: {r['status']} {r['detail'][:90]}" for r in records if r["outcome"] != "ok"
    )
    return {
        "requests": len(records),
        "outcomes": dict(outcomes),
        "success_pct": 100.0 * outcomes["ok"] / len(records) if records else None,
        "hung": outcomes["hung"],
        "wrong_200": outcomes["wrong"],
        "errors": outcomes["error"],
        "p50_latency_s": pct(latencies, 50),
        "p99_latency_s": pct(latencies, 99),
        "p99_ok_latency_s": pct(ok_latencies, 99),
        "max_latency_s": max(latencies) if latencies else None,
        "elapsed_s": result["elapsed"],
        "failure_kinds": dict(details.most_common(12)),
        "decode_engines": engines,
        "narwhal_status": status,
        "flags": spec.flags,
    }
