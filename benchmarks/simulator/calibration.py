"""Simulated versus measured TTFT and TPOT on a real vLLM pair, in one command.

    .venv/bin/python benchmarks/simulator/calibration.py [--producer URL --consumer URL] [--runs 2]

Without ``--producer``/``--consumer`` it builds the tiny model and starts a NixlConnector
producer/consumer pair of the CPU vLLM (``narwhal.vllm.processes``, ``.venv-vllm``), and stops it
at the end. Then:

1. ``narwhal serve`` in front of the pair (its own process group, 127.0.0.1, stopped at the end);
2. ``--runs`` rounds, each: calibrate the pair (:func:`narwhal.vllm.calibrate.calibrate_engine`,
   what ``narwhal calibrate --engine P --decode-engine D`` runs), then the workload live:
   ``--requests`` streamed completions with Poisson arrivals at ``--rate`` (seeded; the same
   arrivals every round), prompts drawn from ``--lengths`` tokens, ``--tokens`` output tokens,
   each prompt unique (no prefix-cache hits); client-side TTFT (request sent to first token)
   and TPOT ((last token - first token) / (tokens - 1)); right before and after it, a step check
   (the consumer's one-stream decode step and this machine's speed, :func:`step_check`);
3. the same arrivals through the simulator (a trace file of the arrivals, ``timing = "linear"``
   with the round's calibrated parameters): the router's ``first_byte_s`` and ``tpot_s``; and
   once more with a fit of all rounds' samples together ("pooled"), compared with all rounds'
   requests together;
4. a table of live and simulated p50/p99 and the simulation's error, per round and pooled, and
   the machine's load average in each round (calibrating next to each live run lets both see
   the same load on a shared machine).

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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sim_speed import machine_reference_us  # noqa: E402

from narwhal.core.sse import EventKind  # noqa: E402
from narwhal.engines.client import EngineClient, EngineError  # noqa: E402
from narwhal.sim.results import percentile, record_rows  # noqa: E402
from narwhal.sim.runner import run as simulate  # noqa: E402
from narwhal.sim.scenario import load_scenario  # noqa: E402
from narwhal.vllm.calibrate import calibrate_engine  # noqa: E402
from narwhal.vllm.fit import EngineCalibration, engine_json, engine_report, fit_engine  # noqa: E402
from narwhal.vllm.measure import HandoffSample, PrefillSample, StepSample, time_batch  # noqa: E402
from narwhal.vllm.processes import (  # noqa: E402
    MODEL_NAME,
    free_port,
    pair_specs,
    start_engines,
    stop_all,
)
from narwhal.vllm.tiny_model import build_in_venv  # noqa: E402
from tests.vllm.handoff import wait_pair_ready  # noqa: E402

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


def request_body(prompt: int, output: int) -> dict[str, Any]:
    """One streamed completion of the workload (a unique prompt of ``prompt`` tokens)."""
    return {
        "model": MODEL_NAME,
        "prompt": prompt_text(prompt),
        "max_tokens": output,
        "temperature": 0,
        "stream": True,
    }


def timed(prompt: int, tokens: int, ok: bool, sent: float, stamps: list[float]) -> dict[str, Any]:
    """A request's record: client-side TTFT (sent -> first token) and TPOT."""
    return {
        "prompt_tokens": prompt,
        "output_tokens": tokens,
        "ok": ok,
        "ttft_s": stamps[0] - sent if stamps else None,
        "tpot_s": (stamps[-1] - stamps[0]) / (tokens - 1) if ok and tokens > 1 else None,
    }


async def one_request(
    http: httpx.AsyncClient, url: str, delay: float, prompt: int, output: int
) -> dict[str, Any]:
    await asyncio.sleep(delay)
    body = request_body(prompt, output) | {"stream_options": {"include_usage": True}}
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
    return timed(prompt, tokens, ok, sent, stamps) | {"status": status}


async def live_run(url: str, arrivals: list[tuple[float, int, int]]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=len(arrivals) + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        return list(
            await asyncio.gather(*(one_request(http, url, t, p, o) for t, p, o in arrivals))
        )


async def one_direct_request(
    producer: EngineClient, consumer: EngineClient, delay: float, prompt: int, output: int
) -> dict[str, Any]:
    """The same request with no router process: the client runs both legs itself."""
    await asyncio.sleep(delay)
    body = request_body(prompt, output)
    sent = time.perf_counter()
    stamps: list[float] = []
    text = 0
    ok = True
    try:
        handoff = await producer.prefill(body)
        async for event in consumer.decode(handoff, body):
            if event.kind is EventKind.TOKEN and event.payload is not None:
                chunk = "".join(c.get("text") or "" for c in event.payload.get("choices", []))
                stamps.append(time.perf_counter())
                text += len(chunk)
    except EngineError:
        ok = False
    return timed(prompt, text, ok and text == output and len(stamps) > 0, sent, stamps)


async def direct_run(
    producer_url: str, consumer_url: str, arrivals: list[tuple[float, int, int]]
) -> list[dict[str, Any]]:
    async with (
        EngineClient.http(producer_url) as producer,
        EngineClient.http(consumer_url) as consumer,
    ):
        return list(
            await asyncio.gather(
                *(one_direct_request(producer, consumer, t, p, o) for t, p, o in arrivals)
            )
        )


def sim_run(
    arrivals: list[tuple[float, int, int]], cal: EngineCalibration, folder: Path, seed: int
) -> list[dict[str, Any]]:
    folder.mkdir(parents=True, exist_ok=True)
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


def step_check(consumer: str, seed: int, repeats: int = 3) -> dict[str, float]:
    """Right before and right after a live run: the consumer's one-stream decode step (the
    median of ``repeats`` :func:`time_batch`, short prompts, 32 tokens) and this machine's
    speed (``sum(range(1000))`` in microseconds, the best of 5), to see whether the step the
    calibration measured still held while the workload ran."""
    rng = random.Random(seed)
    steps = [
        asyncio.run(time_batch(consumer, MODEL_NAME, 1, 32, rng)).step_s for _ in range(repeats)
    ]
    return {"step_s": statistics.median(steps), "reference_us": machine_reference_us()}


def pct(values: list[float], q: float) -> float:
    got = percentile(values, q)
    return float("nan") if got is None else got


def compare(
    rounds: list[dict[str, Any]],
    arrivals: list[tuple[float, int, int]],
    args: argparse.Namespace,
    folder: Path,
    extra: dict[str, Any] | None = None,
) -> None:
    """Simulate each round's calibration and the pooled fit; print and write the table."""
    for index, item in enumerate(rounds):
        item["sim"] = sim_run(arrivals, item["calibration"], folder / f"r{index}", args.seed)
    first: EngineCalibration = rounds[0]["calibration"]
    pooled = fit_engine(
        first.engine, first.decode_engine, first.model,
        [p for r in rounds for p in r["calibration"].prefill],
        [s for r in rounds for s in r["calibration"].steps],
        [h for r in rounds for h in r["calibration"].handoffs],
        args.statistic,
    )  # fmt: skip
    pooled_sim = sim_run(arrivals, pooled, folder / "pooled", args.seed)

    def live_values(records: list[dict[str, Any]]) -> dict[str, list[float]]:
        ok = [r for r in records if r["ok"]]
        return {
            "ttft": [r["ttft_s"] for r in ok],
            "tpot": [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
        }

    def sim_values(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
        ok = [r for r in rows if r["status"] == 200]
        return {
            "ttft": [r["first_byte_s"] for r in ok if r["first_byte_s"] is not None],
            "tpot": [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
        }

    columns = [
        (f"round {i + 1}", live_values(r["live"]), sim_values(r["sim"]))
        for i, r in enumerate(rounds)
    ]
    pooled_live: dict[str, list[float]] = {"ttft": [], "tpot": []}
    for _, values, _ in columns:
        for key in pooled_live:
            pooled_live[key] += values[key]
    columns.append(("pooled", pooled_live, sim_values(pooled_sim)))
    lines = [f"{'':<10}" + "".join(f"{name:>28}" for name, _, _ in columns)]
    lines.append(f"{'':<10}" + f"{'live':>10}{'sim':>9}{'error':>9}" * len(columns))
    table: dict[str, Any] = {}
    for metric in ("ttft", "tpot"):
        for q in (50, 99):
            name = f"{metric} p{q}"
            cells = ""
            for column, live_v, sim_v in columns:
                measured, simulated = pct(live_v[metric], q), pct(sim_v[metric], q)
                error = (simulated - measured) / measured
                table.setdefault(name, {})[column] = {
                    "live_s": measured,
                    "sim_s": simulated,
                    "error": error,
                }
                cells += f"{measured * 1e3:>8.1f}ms{simulated * 1e3:>7.1f}ms{error:>+9.1%}"
            lines.append(f"{name:<10}{cells}")
    print(
        f"\nworkload: {args.requests} streamed completions, Poisson {args.rate}/s (seed "
        f"{args.seed}), prompts {args.lengths} tokens, {args.tokens} output tokens; "
        f"{os.cpu_count()} cores; load average per round "
        + ", ".join(f"{r['load'][0]:.1f}->{r['load'][1]:.1f}" for r in rounds)
    )
    print("\n".join(lines))
    print(
        "(error = (sim - live) / live; each round's sim uses that round's calibration, "
        "'pooled' fits all rounds' samples and compares with all rounds' requests; live TTFT "
        "is client-side through narwhal serve, sim TTFT the router's first_byte_s)"
    )
    print(engine_report(pooled).splitlines()[-1].replace("fit error", "pooled fit error"))
    for index, item in enumerate(rounds):
        if item.get("step_check"):
            check = item["step_check"]
            print(
                f"round {index + 1} step check (one stream): calibrated "
                f"{item['calibration'].decode_s_per_token * 1e3:.1f} ms; before the live run "
                f"{check['before']['step_s'] * 1e3:.1f} ms, after it "
                f"{check['after']['step_s'] * 1e3:.1f} ms; machine reference "
                f"{check['before']['reference_us']:.1f} -> {check['after']['reference_us']:.1f} us"
            )
        if item.get("direct"):
            direct = live_values(item["direct"])
            print(
                f"round {index + 1} with no router (the client runs both legs): TTFT p50 "
                f"{pct(direct['ttft'], 50) * 1e3:.1f} ms, TPOT p50 "
                f"{pct(direct['tpot'], 50) * 1e3:.1f} ms"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"calibration-{stamp}.json"
    path.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                **(extra or {}),
                "arrivals": arrivals,
                "rounds": [{**r, "calibration": engine_json(r["calibration"])} for r in rounds],
                "pooled": {"calibration": engine_json(pooled), "sim": pooled_sim},
                "table": table,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"results: {path}")


def reanalyse(path: Path, args: argparse.Namespace) -> int:
    """Refit a results file's samples with the current fit and simulate again (no engines)."""
    data = json.loads(path.read_text())
    if "rounds" not in data:
        raise SystemExit(f"{path}: no per-round samples (written by an older version)")
    stored = data["args"]
    args.requests, args.rate = int(stored["requests"]), float(stored["rate"])
    args.lengths, args.tokens, args.seed = (
        stored["lengths"],
        int(stored["tokens"]),
        int(stored["seed"]),
    )
    args.statistic = stored.get("statistic", args.statistic)
    rounds = []
    for item in data["rounds"]:
        cal = item["calibration"]
        samples = (
            [PrefillSample(**p) for p in cal["prefill"]],
            [StepSample(**s) for s in cal["steps"]],
            [HandoffSample(**h) for h in cal["handoffs"]],
        )
        fit = fit_engine(
            cal["engine"], cal["decode_engine"], cal["model"], *samples, args.statistic
        )
        rounds.append(
            {"calibration": fit, "live": item["live"], "load": tuple(item["load"])}
            | ({"direct": item["direct"]} if "direct" in item else {})
            | ({"step_check": item["step_check"]} if "step_check" in item else {})
        )
    arrivals = [tuple(a) for a in data["arrivals"]]
    folder = Path(tempfile.mkdtemp(prefix="narwhal-reanalyse-"))
    print(f"reanalysing {path} (its live requests, its samples refitted)")
    compare(rounds, arrivals, args, folder, {"reanalysed_from": path.name})  # type: ignore[arg-type]
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producer", help="producer URL (default: start a pair)")
    parser.add_argument("--consumer", help="consumer URL")
    parser.add_argument(
        "--runs", type=int, default=2, help="rounds of (calibrate, then the workload live)"
    )
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument(
        "--rate",
        type=float,
        default=0.5,
        help="requests per second (Poisson; 1.0 saturates 2 cores)",
    )
    parser.add_argument("--lengths", default="64,256,512,1024", help="prompt tokens, drawn")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="calibration repeats per point")
    parser.add_argument("--statistic", choices=["median", "min"], default="median")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-vllm")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="after each routed run, the same arrivals with no router (client runs both legs)",
    )
    parser.add_argument(
        "--reanalyse",
        type=Path,
        metavar="RESULTS_JSON",
        help="no engines: refit a results file's samples with the current fit, simulate again",
    )
    args = parser.parse_args()
    if args.reanalyse:
        return reanalyse(args.reanalyse, args)
    # a SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so the engines it started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lengths = [int(n) for n in args.lengths.split(",")]
    arrivals = workload(args.requests, args.rate, lengths, args.tokens, args.seed)
    folder = Path(tempfile.mkdtemp(prefix="narwhal-calibration-"))
    engines = []
    rounds: list[dict[str, Any]] = []
    try:
        if args.producer and args.consumer:
            producer, consumer = args.producer.rstrip("/"), args.consumer.rstrip("/")
        else:
            model = build_in_venv(args.venv / "narwhal-models" / "tiny-llama-seed0", venv=args.venv)
            started = time.monotonic()
            engines = start_engines(pair_specs(model), folder, venv=args.venv)
            wait_pair_ready(engines[0], engines[1])
            print(f"pair healthy after {time.monotonic() - started:.0f} s (logs in {folder})")
            producer, consumer = engines[0].url, engines[1].url
        config = folder / "narwhal.toml"
        config.write_text(config_text(producer, consumer))
        with narwhal_serve(config, folder / "narwhal.log") as url:
            for index in range(args.runs):
                print(f"round {index + 1}: calibrating {producer} -> {consumer} ...", flush=True)
                load = os.getloadavg()[0]
                cal = calibrate_engine(
                    producer, consumer, model=MODEL_NAME, repeats=args.repeats,
                    seed=args.seed + index, statistic=args.statistic,
                )  # fmt: skip
                print(engine_report(cal), flush=True)
                before = step_check(consumer, args.seed + index)
                started = time.monotonic()
                records = asyncio.run(live_run(url, arrivals))
                after = step_check(consumer, args.seed + index)
                rounds.append(
                    {
                        "calibration": cal,
                        "live": records,
                        "load": (load, os.getloadavg()[0]),
                        "step_check": {"before": before, "after": after},
                    }
                )
                if args.direct:
                    rounds[-1]["direct"] = asyncio.run(direct_run(producer, consumer, arrivals))
                failed = sum(not r["ok"] for r in records)
                print(
                    f"round {index + 1}: live, {len(records)} requests in "
                    f"{time.monotonic() - started:.0f} s, {failed} failed; load average "
                    f"{load:.1f} (calibration start) -> {os.getloadavg()[0]:.1f} (live end)",
                    flush=True,
                )
    finally:
        stop_all(engines)
    compare(rounds, arrivals, args, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
