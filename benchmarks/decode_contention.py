"""Does a producer busy with prefills slow the consumer's decode step? (the real CPU pair)

    .venv/bin/python benchmarks/decode_contention.py [--repeats 4]

Starts a NixlConnector pair of the CPU vLLM (``narwhal.vllm.processes``, ``.venv-vllm``), then
alternates, ``--repeats`` times: the consumer's decode step at 1 and 2 concurrent streams
(:func:`narwhal.vllm.measure.time_batch`, what ``narwhal calibrate`` measures) with the producer
idle, then the same while a thread keeps the producer prefilling 768-token prompts back to back.
Prints each mode's median and every sample. A one-off diagnostic for the TPOT gap in
docs/vllm.md section 4 (not a test); the pair is stopped at the end, SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from cpu_pair import REPO, running_pair

from narwhal.vllm.measure import time_batch, unique_prompt
from narwhal.vllm.processes import MODEL_NAME


def keep_prefilling(producer: str, stop: threading.Event) -> None:
    rng = random.Random(1)
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            body = {"model": MODEL_NAME, "prompt": unique_prompt(768, rng), "max_tokens": 1}
            http.post(producer + "/v1/completions", json=body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-vllm")
    args = parser.parse_args()
    samples: dict[str, dict[int, list[float]]] = {"idle": {1: [], 2: []}, "busy": {1: [], 2: []}}
    with running_pair(args.venv, "narwhal-contention-") as (producer, consumer):
        rng = random.Random(0)
        for _ in range(args.repeats):
            for mode in ("idle", "busy"):
                stop = threading.Event()
                worker = threading.Thread(target=keep_prefilling, args=(producer, stop))
                if mode == "busy":
                    worker.start()
                    time.sleep(0.5)
                for batch in (1, 2):
                    sample = asyncio.run(time_batch(consumer, MODEL_NAME, batch, 32, rng))
                    samples[mode][batch].append(sample.step_s)
                if mode == "busy":
                    stop.set()
                    worker.join()
    for mode, by_batch in samples.items():
        for batch, values in by_batch.items():
            every = ", ".join(f"{v * 1e3:.2f}" for v in values)
            print(
                f"producer {mode}, {batch} stream(s): step median "
                f"{statistics.median(values) * 1e3:.2f} ms (all: {every} ms)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
