"""What sets the decode step on the real CPU pair: the context length, or decoding after a KV pull?

    .venv/bin/python benchmarks/decode_step.py [--repeats 4] [--lengths 24,256,1024]

Starts a NixlConnector pair of the CPU vLLM (``narwhal.vllm.processes``, ``.venv-vllm``), then,
``--repeats`` times and for each prompt length: the consumer's one-stream decode step with a plain
prompt of that length (:func:`narwhal.vllm.measure.time_batch`, what ``narwhal calibrate``
measures, there with 24-character prompts), then the time per token of a decode after a real KV
handoff of a prompt of the same length (:func:`narwhal.vllm.measure.time_handoff`, producer ->
consumer, no router). Prints each point's median and every sample. A diagnostic for the TPOT gap
in docs/vllm.md section 4 (not a test); the pair is stopped at the end, SIGTERM included.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from pathlib import Path

import httpx
from cpu_pair import REPO, running_pair

from narwhal.vllm.measure import time_batch, time_handoff, unique_prompt
from narwhal.vllm.processes import MODEL_NAME

TOKENS = 32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--lengths", default="24,256,1024")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-vllm")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    plain: dict[int, list[float]] = {n: [] for n in lengths}
    handoff: dict[int, list[float]] = {n: [] for n in lengths}
    with running_pair(args.venv, "narwhal-decode-step-") as (producer, consumer):
        rng = random.Random(0)
        with httpx.Client(timeout=120) as http:
            time_handoff(http, producer, consumer, unique_prompt(32, rng), MODEL_NAME, 8)
            for _ in range(args.repeats):
                for n in lengths:
                    step = asyncio.run(
                        time_batch(consumer, MODEL_NAME, 1, TOKENS, rng, prompt_length=n)
                    )
                    plain[n].append(step.step_s)
                    sample = time_handoff(
                        http, producer, consumer, unique_prompt(n, rng), MODEL_NAME, TOKENS
                    )
                    handoff[n].append(sample.decode_s_per_token)
    for n in lengths:
        for name, values in (("plain step", plain[n]), ("after handoff", handoff[n])):
            every = ", ".join(f"{v * 1e3:.2f}" for v in values)
            print(
                f"prompt {n:5d} chars, {name:13s}: median {statistics.median(values) * 1e3:.2f} "
                f"ms per token (all: {every})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
