"""Simulated versus measured TTFT and TPOT on a real vLLM pair, in one command.

    .venv/bin/python benchmarks/calibration.py [--producer URL --consumer URL] [--runs 2]

Without ``--producer``/``--consumer`` it builds the tiny model and starts a NixlConnector
producer/consumer pair of the CPU vLLM (``narwhal.vllm.engines``, ``.venv-vllm``), and stops it
at the end. Then:

1. ``narwhal serve`` in front of the pair (its own process group, 127.0.0.1, stopped at the end);
2. calibrate the pair (:func:`narwhal.vllm.calibrate.calibrate_engine`, what ``narwhal calibrate
   --engine P --decode-engine D`` runs);
3. the workload, live, ``--runs`` times: ``--requests`` streamed completions with Poisson arrivals
   at ``--rate`` (seeded), prompts drawn from ``--lengths`` tokens, ``--tokens`` output tokens,
   each prompt unique (no prefix-cache hits); client-side TTFT (request sent to first token) and
   TPOT ((last token - first token) / (tokens - 1));
4. the same arrivals through the simulator (a trace file of the arrivals, ``timing = "linear"``
   with the calibrated parameters): the router's ``first_byte_s`` and ``tpot_s``;
5. a table of p50/p99 per run and simulated, and the simulation's error at p50 against each run
   and against the mean of the runs; the machine's load average during each run.

Writes everything (samples, fit, per-request figures) as JSON under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from narwhal.sim.results import percentile, record_rows  # noqa: E402
from narwhal.sim.runner import run as simulate  # noqa: E402
from narwhal.sim.scenario import load_scenario  # noqa: E402
from narwhal.vllm.calibrate import (  # noqa: E402
    EngineCalibration,
    calibrate_engine,
    engine_json,
    engine_report,
)
from narwhal.vllm.engines import (  # noqa: E402
    MODEL_NAME,
    build_tiny_model,
    free_port,
    pair_specs,
    start_engines,
    stop_all,
    wait_pair_ready,
)

ENGINE_TIMEOUTS = {
    "first_token_timeout_s": 30.0,
    "decode_read_timeout_s": 15.0,
    "request_timeout_s": 180.0,
    "max_handoff_age_s": 25.0,
}


def workload(
    requests: int, rate: float, lengths: list[int], tokens: int, seed: int
) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens): Poisson arrivals, prompt lengths drawn."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(requests):
        t += rng.expovariate(rate)
        out.append((t, rng.choice(lengths), tokens))
    return out


def config_text(producer: str, consumer: str) -> str:
    lines = ["[engine]", *(f"{k} = {v!r}" for k, v in ENGINE_TIMEOUTS.items()), ""]
    lines += ["[[engines]]", f'url = "{producer}"', 'role = "prefill"', ""]
    lines += ["[[engines]]", f'url = "{consumer}"', 'role = "decode"', ""]
    return "\n".join(lines)


@contextmanager
def narwhal_serve(config: Path, log: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "narwhal.cli", "serve", "--config", str(config),
             "--port", str(port)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        end = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"narwhal serve exited {proc.returncode}: see {log}")
            try:
                if httpx.get(url + "/status", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"narwhal serve not up after 30 s: see {log}")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


def prompt_text(tokens: int) -> str:
    """``tokens - 1`` characters (the tiny model adds BOS), unique so no prefix is cached."""
    head = uuid.uuid4().hex + " "
    body = head * (tokens // len(head) + 1)
    return body[: tokens - 1]


async def one_request(
    http: httpx.AsyncClient, url: str, delay: float, prompt: int, output: int
) -> dict[str, Any]:
    await asyncio.sleep(delay)
    body = {
        "model": MODEL_NAME,
        "prompt": prompt_text(prompt),
        "max_tokens": output,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    stamps: list[float] = []
    text = 0
    tokens = 0
    status = 0
    async with http.stream("POST", url + "/v1/completions", json=body) as stream:
        status = stream.status_code
        async for line in stream.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                status = 599
                continue
            chunk = "".join(c.get("text") or "" for c in event.get("choices", []))
            if chunk:
                stamps.append(time.perf_counter())
                text += len(chunk)
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    tokens = tokens or text  # the tiny model: one character per token
    ok = status == 200 and len(stamps) > 0 and tokens == output
    return {
        "prompt_tokens": prompt,
        "output_tokens": tokens,
        "status": status,
        "ok": ok,
        "ttft_s": stamps[0] - sent if stamps else None,
        "tpot_s": (stamps[-1] - stamps[0]) / (tokens - 1) if ok and tokens > 1 else None,
    }


async def live_run(url: str, arrivals: list[tuple[float, int, int]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=len(arrivals) + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        return list(
            await asyncio.gather(*(one_request(http, url, t, p, o) for t, p, o in arrivals))
        )


def sim_run(
    arrivals: list[tuple[float, int, int]], cal: EngineCalibration, folder: Path, seed: int
) -> list[dict[str, Any]]:
    trace = folder / "arrivals.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t * 1e3, "input_length": p, "output_length": o}) + "\n"
            for t, p, o in arrivals
        )
    )
    first = arrivals[0][0]
    scenario = folder / "scenario.toml"
    scenario.write_text(
        "\n".join(
            [
                'name = "calibration"',
                "[engine]",
                *(f"{k} = {v!r}" for k, v in ENGINE_TIMEOUTS.items()),
                "",
                cal.toml(),
                "[workload]",
                'kind = "trace"',
                f"trace = {json.dumps(str(trace))}",
                f"max_requests = {len(arrivals)}",
                "stream = true",
                "",
                "[sim]",
                f"seed = {seed}",
                "",
            ]
        )
    )
    result = simulate(load_scenario(scenario))
    rows = record_rows(result)
    # the trace is replayed from its first request: shift back to the live clock (not needed
    # for per-request latencies, kept for the JSON)
    for row in rows:
        if row["arrival"] is not None:
            row["arrival"] += first
    return rows


def pct(values: list[float], q: float) -> float:
    got = percentile(values, q)
    return float("nan") if got is None else got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producer", help="producer URL (default: start a pair)")
    parser.add_argument("--consumer", help="consumer URL")
    parser.add_argument("--runs", type=int, default=2, help="live runs of the workload")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second (Poisson)")
    parser.add_argument("--lengths", default="64,256,512,1024", help="prompt tokens, drawn")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="calibration repeats per point")
    parser.add_argument("--statistic", choices=["median", "min"], default="median")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-vllm")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    arrivals = workload(args.requests, args.rate, lengths, args.tokens, args.seed)
    folder = Path(tempfile.mkdtemp(prefix="narwhal-calibration-"))
    engines = []
    try:
        if args.producer and args.consumer:
            producer, consumer = args.producer.rstrip("/"), args.consumer.rstrip("/")
        else:
            model = build_tiny_model(
                args.venv / "narwhal-models" / "tiny-llama-seed0", venv=args.venv
            )
            started = time.monotonic()
            engines = start_engines(pair_specs(model), folder, venv=args.venv)
            wait_pair_ready(engines[0], engines[1])
            print(f"pair healthy after {time.monotonic() - started:.0f} s (logs in {folder})")
            producer, consumer = engines[0].url, engines[1].url
        config = folder / "narwhal.toml"
        config.write_text(config_text(producer, consumer))
        print(f"calibrating {producer} -> {consumer} ...", flush=True)
        load_cal = os.getloadavg()[0]
        cal = calibrate_engine(
            producer, consumer, model=MODEL_NAME, repeats=args.repeats, seed=args.seed,
            statistic=args.statistic,
        )  # fmt: skip
        print(engine_report(cal), flush=True)
        live: list[list[dict[str, Any]]] = []
        loads: list[tuple[float, float]] = []
        with narwhal_serve(config, folder / "narwhal.log") as url:
            for index in range(args.runs):
                before = os.getloadavg()[0]
                started = time.monotonic()
                records = asyncio.run(live_run(url, arrivals))
                loads.append((before, os.getloadavg()[0]))
                failed = sum(not r["ok"] for r in records)
                print(
                    f"live run {index + 1}: {len(records)} requests in "
                    f"{time.monotonic() - started:.0f} s, {failed} failed, load average "
                    f"{before:.1f} -> {loads[-1][1]:.1f}",
                    flush=True,
                )
                live.append(records)
        sim_rows = sim_run(arrivals, cal, folder, args.seed)
    finally:
        stop_all(engines)

    sim_ok = [r for r in sim_rows if r["status"] == 200]
    columns: list[tuple[str, dict[str, list[float]]]] = []
    for index, records in enumerate(live):
        ok = [r for r in records if r["ok"]]
        columns.append(
            (
                f"live {index + 1}",
                {
                    "ttft": [r["ttft_s"] for r in ok],
                    "tpot": [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
                },
            )
        )
    sim_values = {
        "ttft": [r["first_byte_s"] for r in sim_ok if r["first_byte_s"] is not None],
        "tpot": [r["tpot_s"] for r in sim_ok if r["tpot_s"] is not None],
    }
    header = f"{'metric':<10}" + "".join(f"{name:>10}" for name, _ in columns)
    header += f"{'sim':>10}" + "".join(f"{'err ' + name[5:]:>9}" for name, _ in columns)
    header += f"{'err mean':>10}"
    lines = [header]
    table: dict[str, Any] = {}
    for metric in ("ttft", "tpot"):
        for q in (50, 99):
            measured = [pct(values[metric], q) for _, values in columns]
            simulated = pct(sim_values[metric], q)
            errors = [(simulated - m) / m for m in measured]
            mean_error = (simulated - statistics.fmean(measured)) / statistics.fmean(measured)
            name = f"{metric} p{q}"
            table[name] = {
                "live_s": measured,
                "sim_s": simulated,
                "errors": errors,
                "error_vs_mean": mean_error,
            }
            lines.append(
                f"{name:<10}"
                + "".join(f"{m * 1e3:>8.1f}ms" for m in measured)
                + f"{simulated * 1e3:>8.1f}ms"
                + "".join(f"{e:>+9.1%}" for e in errors)
                + f"{mean_error:>+10.1%}"
            )
    print(
        f"\nworkload: {args.requests} streamed completions, Poisson {args.rate}/s (seed "
        f"{args.seed}), prompts {args.lengths} tokens, {args.tokens} output tokens; "
        f"{os.cpu_count()} cores, load average {load_cal:.1f} at calibration"
    )
    print("\n".join(lines))
    print("(err = (sim - live) / live; TTFT live is client-side through narwhal serve, sim is "
          "the router's first_byte_s)")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"calibration-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "arrivals": arrivals,
                "calibration": engine_json(cal),
                "loads": loads,
                "live": live,
                "sim": sim_rows,
                "table": table,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
