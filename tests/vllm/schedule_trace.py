"""Run a closed workload through a real vLLM engine and record what its scheduler did, step by
step: the evidence the simulated engine's scheduler is checked against.

Rule kept here: the workload is closed and the record is independent of timing. Every request
is added before the engine takes its first step (vLLM's offline ``LLM`` with the engine core in
this process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ``generate`` adds them all, then steps), and
each one has a fixed prompt (token ids) and a fixed output length (``max_tokens`` with
``ignore_eos``). What a step schedules then depends only on the scheduler's rules, never on how
fast this machine runs the model.

Theory of operation: run with the vLLM env's Python (``python -m tests.vllm.schedule_trace``,
this checkout on ``PYTHONPATH``) and a JSON list of jobs on stdin, each::

    {"model": DIR, "engine": {"max_num_seqs": 4, ...}, "requests": [[prompt, out], ...]}

``engine`` is passed to ``vllm.LLM`` as keyword arguments. The engine core's scheduler has its
``schedule`` wrapped (an observer: it calls the real one and reads its output): per step, the
tokens scheduled for each request (in the order the scheduler listed them) and the requests
preempted since the previous step. The reply on stdout is JSON: ``steps`` (a list of
``{"tokens": {request index: n}, "preempted": [request index, ...]}``), ``block_size``,
``num_blocks`` and the engine's own counters from ``LLM.get_metrics()``
(``vllm:iteration_tokens_total``'s sum and count, ``vllm:num_preemptions``, prompt and generation
tokens), which must agree with the steps. The prompts are distinct token ids (no two share a
block), so prefix caching, if on, finds nothing.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Run ``job`` (see the module docstring) and return its record."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    vllm = importlib.import_module("vllm")  # the vLLM env's, there only (untyped here)
    LLM, SamplingParams = vllm.LLM, vllm.SamplingParams
    TokensPrompt = importlib.import_module("vllm.inputs").TokensPrompt

    llm = LLM(model=job["model"], disable_log_stats=False, **job["engine"])
    core = llm.llm_engine.engine_core.engine_core  # the in-process EngineCore
    scheduler = core.scheduler
    index: dict[str, int] = {}
    steps: list[dict[str, Any]] = []
    real_schedule = scheduler.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        output = real_schedule(*args, **kwargs)
        if output.total_num_scheduled_tokens:
            tokens = {index[rid]: n for rid, n in output.num_scheduled_tokens.items()}
            preempted = sorted(index[rid] for rid in output.preempted_req_ids or ())
            steps.append({"tokens": tokens, "preempted": preempted})
        return output

    scheduler.schedule = schedule
    prompts = []
    params = []
    for i, (prompt, out) in enumerate(job["requests"]):
        ids = [(i * 7 + k) % 90 + 10 for k in range(prompt)]  # distinct prompts, no shared blocks
        prompts.append(TokensPrompt(prompt_token_ids=ids))
        params.append(SamplingParams(max_tokens=out, ignore_eos=True, temperature=0.0))
    real_add = scheduler.add_request

    def add_request(request: Any) -> Any:
        index[request.request_id] = len(index)
        return real_add(request)

    scheduler.add_request = add_request
    results = llm.generate(prompts, params, use_tqdm=False)
    metrics: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = metric.name
        if name == "vllm:iteration_tokens_total":
            metrics["iteration_tokens_sum"] = float(metric.sum)
            metrics["iteration_tokens_count"] = float(metric.count)
        elif name in ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens"):
            metrics[name] = float(metric.value)
    cache = scheduler.kv_cache_manager
    del llm
    return {
        "steps": steps,
        "outputs": [len(result.outputs[0].token_ids) for result in results],
        "block_size": scheduler.block_size,
        "num_blocks": cache.block_pool.num_gpu_blocks,
        "async_scheduling": bool(scheduler.scheduler_config.async_scheduling),
        "metrics": metrics,
    }


def main() -> None:
    """Read a list of jobs on stdin, run them one after another in this process (one start-up
    of vLLM's imports for all), and write their records as one JSON list on the last line."""
    jobs = json.load(sys.stdin)
    records = []
    for job in jobs:
        records.append(run(job))
        gc.collect()
    sys.stdout.write("\n" + json.dumps(records) + "\n")


if __name__ == "__main__":
    main()
