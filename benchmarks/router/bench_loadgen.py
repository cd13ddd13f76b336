"""The load generator of the router benchmarks: a process of its own, driven over stdin/stdout.

Run as ``.venv/bin/python benchmarks/router/bench_loadgen.py`` (``bench_stack.LoadGen`` starts
it): one JSON command per stdin line (``ttft``, ``throughput``, ``faults``, ``quit``), answered
with JSON lines on stdout (``{"event": "start"}`` when a measured window opens, ``{"event": "end",
"result": ...}`` when the command is done). Every request is a streamed completion, and every
response is checked against the emulator's deterministic text (``_expected``): ok, error (non-200,
transport error or an in-band error event), wrong (200, no error, not the expected text) or hung
(not finished at the bound). It never raises on a bad response.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Any

from bench_stack import MODEL, PROMPT_FILLER


def _expected(prompt: str, max_tokens: int) -> str:
    from narwhal.emulator.text import completion_text

    return completion_text({"prompt": prompt}, False, max_tokens)


async def _one(
    client: Any,
    target: dict[str, Any],
    prompt: str,
    max_tokens: int,
    bound: float,
    counter: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One streamed completion through ``target``; never raises."""
    import aiohttp

    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
    }
    rec: dict[str, Any] = {
        "status": None,
        "ttft": None,
        "latency": None,
        "tokens": 0,
        "done": False,
        "error_event": False,
        "outcome": "error",
        "detail": "",
    }
    text: list[str] = []
    start = time.perf_counter()
    try:
        async with asyncio.timeout(bound):
            if target["kind"] == "direct_pd":
                leg = dict(body, max_tokens=1, stream=False)
                leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
                async with client.post(target["prefill"] + "/v1/completions", json=leg) as reply:
                    prefilled = json.loads(await reply.read())
                body["kv_transfer_params"] = prefilled.get("kv_transfer_params")
                url = target["decode"] + "/v1/completions"
            else:
                url = target["url"] + "/v1/completions"
            async with client.post(url, json=body) as response:
                rec["status"] = response.status
                if response.status != 200:
                    rec["detail"] = (await response.read())[:200].decode(errors="replace")
                    rec["outcome"] = "error"
                else:
                    buf = b""
                    async for chunk in response.content.iter_any():
                        buf += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
                        while True:
                            cut = buf.find(b"\n\n")
                            if cut < 0:
                                break
                            event, buf = buf[:cut], buf[cut + 2 :]
                            for line in event.split(b"\n"):
                                if not line.startswith(b"data:"):
                                    continue
                                data = line[5:].strip()
                                if data == b"[DONE]":
                                    rec["done"] = True
                                    continue
                                obj = json.loads(data)
                                if "error" in obj:
                                    rec["error_event"] = True
                                    rec["detail"] = str(obj["error"])[:200]
                                    continue
                                choices = obj.get("choices") or []
                                token = choices[0].get("text") if choices else None
                                if token:
                                    if rec["ttft"] is None:
                                        rec["ttft"] = time.perf_counter() - start
                                    rec["tokens"] += 1
                                    text.append(token)
                                    if counter is not None:
                                        counter["chunks"] += 1
                    got = "".join(text)
                    if rec["error_event"]:
                        rec["outcome"] = "error"
                    elif got == _expected(prompt, max_tokens):
                        rec["outcome"] = "ok"
                    else:
                        rec["outcome"] = "wrong"
                        rec["detail"] = f"{len(got)}/{max_tokens} chars, done={rec['done']}"
    except TimeoutError:
        rec["outcome"] = "hung"
        rec["detail"] = f"status={rec['status']} tokens={rec['tokens']}"
    except (aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as error:
        rec["outcome"] = "error"
        rec["detail"] = f"{type(error).__name__}: {error}"[:200]
    rec["latency"] = time.perf_counter() - start
    return rec


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def _cmd_ttft(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    targets, rng = cmd["targets"], random.Random(cmd.get("seed", 0))
    out: dict[str, dict[str, Any]] = {
        t["name"]: {"ttft": [], "outcomes": Counter()} for t in targets
    }
    for index in range(cmd["warmup"] + cmd["rounds"]):
        order = list(targets)
        rng.shuffle(order)
        for target in order:
            prompt = f"{PROMPT_FILLER}[ttft {index} {target['name']}]"
            rec = await _one(client, target, prompt, cmd["max_tokens"], cmd["bound"])
            if index < cmd["warmup"]:
                continue
            out[target["name"]]["outcomes"][rec["outcome"]] += 1
            if rec["outcome"] == "ok":
                out[target["name"]]["ttft"].append(rec["ttft"])
    return {name: {"ttft": v["ttft"], "outcomes": dict(v["outcomes"])} for name, v in out.items()}


async def _cmd_throughput(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    target, counter = cmd["target"], {"chunks": 0}
    outcomes: Counter[str] = Counter()
    phase = {"measuring": False, "stop": False}
    seq = iter(range(10**9))
    ttfts: list[float] = []  # of the measured requests, under this closed-loop load

    async def worker() -> None:
        while not phase["stop"]:
            prompt = f"{PROMPT_FILLER}[tput {next(seq)}]"
            rec = await _one(client, target, prompt, cmd["max_tokens"], cmd["bound"], counter)
            if phase["measuring"]:
                outcomes[rec["outcome"]] += 1
                if rec["ttft"] is not None:
                    ttfts.append(rec["ttft"])

    tasks = [asyncio.create_task(worker()) for _ in range(cmd["concurrency"])]
    await asyncio.sleep(cmd["warmup"])
    counter["chunks"] = 0
    phase["measuring"] = True
    began = time.perf_counter()
    _emit({"event": "start"})
    await asyncio.sleep(cmd["duration"])
    phase["stop"] = True
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    return {
        "chunks": counter["chunks"],
        "elapsed": elapsed,
        "outcomes": dict(outcomes),
        "all_requests": next(seq),  # warm-up included
        "ttfts": ttfts,
    }


async def _cmd_faults(client: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    target, total = cmd["target"], int(cmd["rate"] * cmd["duration"])
    tasks = []
    began = time.perf_counter()
    _emit({"event": "start"})
    for index in range(total):
        delay = began + index / cmd["rate"] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        prompt = f"{PROMPT_FILLER}[fault {index}]"
        tasks.append(
            asyncio.create_task(_one(client, target, prompt, cmd["max_tokens"], cmd["bound"]))
        )
    records = await asyncio.gather(*tasks)
    return {"records": records, "elapsed": time.perf_counter() - began}


def loadgen_main() -> None:
    """The load generator process: one JSON command per stdin line, one JSON answer per line.

    Its client is aiohttp's on uvloop: an httpx client on asyncio spends more CPU per chunk
    than the routers it measures, so with 16 streams the throughput rounds' TTFT was mostly
    the load generator's own queueing."""
    import aiohttp
    import uvloop

    async def serve() -> None:
        connector = aiohttp.TCPConnector(limit=2000, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line or not line.strip():
                    return
                cmd = json.loads(line)
                if cmd["cmd"] == "quit":
                    return
                handler = {
                    "ttft": _cmd_ttft,
                    "throughput": _cmd_throughput,
                    "faults": _cmd_faults,
                }[cmd["cmd"]]
                _emit({"event": "end", "result": await handler(client, cmd)})

    uvloop.run(serve())


if __name__ == "__main__":
    loadgen_main()
