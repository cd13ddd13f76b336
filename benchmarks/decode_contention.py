"""Does a producer busy with prefills slow the consumer's decode step? (the real CPU pair)

    .venv/bin/python benchmarks/decode_contention.py [--repeats 4]

Starts a NixlConnector pair of the CPU vLLM (``narwhal.vllm.engines``, ``.venv-vllm``), then
alternates, ``--repeats`` times: the consumer's decode step at 1 and 2 concurrent streams
(:func:`narwhal.vllm.calibrate.time_batch`, what ``narwhal calibrate`` measures) with the producer
idle, then the same while a thread keeps the producer prefilling 768-token prompts back to back.
Prints each mode's median and every sample. A one-off diagnostic for the TPOT gap in
docs/vllm.md section 4 (not a test); the pair is stopped at the end, SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from narwhal.vllm.calibrate import time_batch, unique_prompt  # noqa: E402
from narwhal.vllm.engines import (  # noqa: E402
    MODEL_NAME,
    build_tiny_model,
    pair_specs,
    start_engines,
    stop_all,
    wait_pair_ready,
)


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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model = build_tiny_model(args.venv / "narwhal-models" / "tiny-llama-seed0", venv=args.venv)
    folder = Path(tempfile.mkdtemp(prefix="narwhal-contention-"))
    engines = start_engines(pair_specs(model), folder, venv=args.venv)
    samples: dict[str, dict[int, list[float]]] = {"idle": {1: [], 2: []}, "busy": {1: [], 2: []}}
    try:
        wait_pair_ready(engines[0], engines[1])
        producer, consumer = engines[0].url, engines[1].url
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
    finally:
        stop_all(engines)
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
