"""Simulator speed: simulated requests per wall second (and per CPU second).

100k requests of the Azure conversation trace (AzurePublicDataset, CC-BY-4.0; looped and time-
compressed to load the fleet) on a 16-engine fleet (8 prefill + 8 decode, Llama-3-8B on H200)
with faults (crashes, hangs, slow engines, stalling streams, in-band errors at field-like rates
compressed in time), the decision log disabled (``DecisionLog(enabled=False)``). Not a test.

    .venv/bin/python benchmarks/sim_speed.py [--requests N] [--stream-interval K] [--profile]

``--stream-interval`` is the engines' tokens per streamed chunk (vLLM's ``--stream-interval``);
every chunk goes through the core's real SSE parser, so it sets the per-token cost.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
import timeit

from narwhal.core.records import DecisionLog
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario

SCENARIO = """
name = "sim-speed"
[engine]
first_token_timeout_s = 5.0
decode_read_timeout_s = 5.0
request_timeout_s = 120.0
max_handoff_age_s = 10.0
[recovery]
eject_after = 3
max_attempts = 2
probe_interval_s = 5.0
[fleet]
prefill = 8
decode = 8
model = "llama3-8b"
block_size = {block_size}
stream_interval = {stream_interval}
[workload]
kind = "trace"
trace = "azure2023_conv"
rate_scale = {rate_scale}
repeat = true
max_requests = {requests}
[sim]
seed = 1
sample_interval_s = 5.0
decision_log = false
[[faults]]
kind = "crash"
role = "any"
rate_per_hour = 4.0
duration_s = 30.0
[[faults]]
kind = "hang"
role = "decode"
rate_per_hour = 4.0
duration_s = 30.0
[[faults]]
kind = "slow"
role = "any"
rate_per_hour = 6.0
duration_s = 60.0
factor = 2.0
[[faults]]
kind = "stall"
role = "decode"
rate_per_hour = 6.0
duration_s = 20.0
probability = 0.1
after_tokens = 10
[[faults]]
kind = "inband_error"
role = "decode"
rate_per_hour = 6.0
duration_s = 20.0
probability = 0.1
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--stream-interval", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--rate-scale",
        type=float,
        default=35.0,
        help="trace time compression (35: about 190 req/s offered)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile, top 30 by own time")
    args = parser.parse_args()
    import tomllib

    scenario = parse_scenario(
        tomllib.loads(
            SCENARIO.format(
                requests=args.requests,
                stream_interval=args.stream_interval,
                block_size=args.block_size,
                rate_scale=args.rate_scale,
            )
        ),
        "sim_speed",
    )
    run(
        scenario.model_copy(
            update={"workload": scenario.workload.model_copy(update={"max_requests": 50})}
        )
    )  # warm caches: profile fit, trace parse
    profiler = cProfile.Profile() if args.profile else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    result = run(scenario, log=DecisionLog(enabled=False))
    if profiler:
        profiler.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = len(result.records)
    ok = sum(1 for r in result.records if r.status == 200)
    ejections = sum(e["times_ejected"] for e in result.engines.values())
    print(
        f"{n} requests ({ok} ok, {ejections} ejections, {len(result.fault_windows)} fault "
        f"windows) over {result.sim_end_s:.0f} simulated s, stream_interval "
        f"{args.stream_interval}, block_size {args.block_size}"
    )
    done = [r for r in result.records if r.status == 200 and r.first_byte_s is not None]
    done.sort(key=lambda r: r.first_byte_s or 0.0)
    if done:
        print(
            f"client TTFT p50 {done[len(done) // 2].first_byte_s * 1e3:.0f} ms, "
            f"p99 {done[int(len(done) * 0.99)].first_byte_s * 1e3:.0f} ms"
        )
    print(f"wall {wall:.2f} s -> {n / wall:,.0f} simulated requests per wall second")
    print(f"cpu  {cpu:.2f} s -> {n / cpu:,.0f} simulated requests per CPU second")
    reference = min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000
    print(f"machine reference: sum(range(1000)) takes {reference * 1e6:.1f} us")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
