"""One run of a sweep: simulate a scenario and reduce it to a row of metrics.

Rule kept here: :func:`run_task` is a top-level function of a picklable :class:`RunTask` whose
result depends on the task alone (the scenario mapping and the seed). It is what every backend
calls, in this process, in a spawned process or in a Ray worker; nothing in it reads global
state, the clock (wall time is reported beside the result, never inside the metrics) or files.

Theory of operation: the task's scenario mapping is parsed by the simulator, run with the
task's seed, and summarised by :func:`narwhal.sim.results.summarize` (DistServe SLO
attainment). The row keeps the numbers sweeps compare: success, ``first_byte_s`` (the client's
time to first token) and TPOT percentiles, attainment, retries, resumed streams, ejections,
and one ``errors.<class>`` count per error class seen. A scenario with workload classes
(``[[workload.classes]]``) adds, per class, ``class.<name>.<metric>`` for each of
:data:`CLASS_FIELDS` (from ``summary.json``'s ``classes``; ``on_time_rps`` is the class's
goodput at the offered load: its on-time requests per second of the run's arrival span); a
scenario without them adds none, so its row is what it always was. With ``task.samples`` the
sorted ``first_byte_s`` of every successful request comes back too, for CDFs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from narwhal.experiments.plan import RunTask

METRIC_FIELDS = (
    "requests",
    "succeeded",
    "success_pct",
    "rejected_pct",
    "offered_rps",
    "first_byte_p50_s",
    "first_byte_p90_s",
    "first_byte_p99_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "slo_attainment_pct",
    "on_time_rps",
    "retried_requests",
    "resumed_requests",
    "ejections",
    "preemptions",
    "prefix_cache_hit_rate",
    "fault_windows",
    "sim_time_s",
)
ERROR_PREFIX = "errors."
REJECTED_STATUS = 503  # the router refused the request (admission bound, no eligible engine)
CLASS_PREFIX = "class."
CLASS_FIELDS = (
    "requests",
    "success_pct",
    "slo_attainment_pct",
    "on_time_rps",
    "shed",
    "first_byte_p50_s",
    "first_byte_p90_s",
    "first_byte_p99_s",
)


def is_counted(key: str) -> bool:
    """Whether ``key`` is one of a row's open-ended columns (error classes, workload classes)."""
    return key.startswith(ERROR_PREFIX) or key.startswith(CLASS_PREFIX)


@dataclass(frozen=True)
class RunOutcome:
    """What one run produced; ``wall_s`` is informational and never written to results."""

    task: int
    metrics: dict[str, Any]
    first_bytes: tuple[float, ...] | None
    wall_s: float


def run_task(task: RunTask) -> RunOutcome:
    """Simulate one task (the entry point every backend calls)."""
    from narwhal.sim.results import percentile, record_rows, summarize
    from narwhal.sim.runner import run
    from narwhal.sim.scenario import parse_scenario

    scenario = parse_scenario(task.scenario, f"run {task.index}")
    result = run(scenario, task.seed)
    rows = record_rows(result)
    summary = summarize(result, rows)
    first_bytes_ok = [
        r["first_byte_s"] for r in rows if r["status"] == 200 and r["first_byte_s"] is not None
    ]
    p90 = percentile(first_bytes_ok, 90)
    rejected = sum(1 for r in rows if r["status"] == REJECTED_STATUS)
    metrics: dict[str, Any] = {
        "requests": summary["requests"],
        "succeeded": summary["succeeded"],
        "success_pct": summary["success_pct"],
        "rejected_pct": round(100.0 * rejected / len(rows), 3) if rows else 0.0,
        "offered_rps": summary["offered_rps"],
        "first_byte_p50_s": summary["first_byte_s"]["p50"],
        "first_byte_p90_s": None if p90 is None else round(p90, 6),
        "first_byte_p99_s": summary["first_byte_s"]["p99"],
        "ttft_p99_s": summary["ttft_s"]["p99"],
        "tpot_p50_s": summary["tpot_s"]["p50"],
        "tpot_p99_s": summary["tpot_s"]["p99"],
        "slo_attainment_pct": summary["slo_attainment_pct"],
        "on_time_rps": summary["on_time_rps"],
        "retried_requests": summary["retried_requests"],
        # committed streams resumed on another engine (none with recovery.resume_streams off)
        "resumed_requests": summary.get("resumed_requests", 0),
        "ejections": summary["ejections"],
        "preemptions": summary["preemptions"],
        "prefix_cache_hit_rate": summary["prefix_cache_hit_rate"],
        "fault_windows": summary["fault_windows"],
        "sim_time_s": summary["sim_time_s"],
    }
    for kind, count in summary["errors_by_class"].items():
        metrics[f"{ERROR_PREFIX}{kind}"] = count
    span = result.last_arrival_s - result.first_arrival_s if result.requests > 1 else 0.0
    for name, figures in summary.get("classes", {}).items():
        metrics.update(class_metrics(name, figures, span))
    first_bytes = None
    if task.samples:
        first_bytes = tuple(sorted(first_bytes_ok))
    return RunOutcome(task.index, metrics, first_bytes, result.wall_s)


def class_metrics(name: str, figures: dict[str, Any], span_s: float) -> dict[str, Any]:
    """One workload class's ``class.<name>.<metric>`` columns from its summary."""
    on_time = figures["slo_attainment_pct"] / 100.0 * figures["requests"]
    first = figures["first_byte_s"]
    values = {
        "requests": figures["requests"],
        "success_pct": figures["success_pct"],
        "slo_attainment_pct": figures["slo_attainment_pct"],
        "on_time_rps": round(on_time / span_s, 3) if span_s > 0 else None,
        "shed": figures["shed"],
        "first_byte_p50_s": first["p50"],
        "first_byte_p90_s": first["p90"],
        "first_byte_p99_s": first["p99"],
    }
    return {f"{CLASS_PREFIX}{name}.{key}": values[key] for key in CLASS_FIELDS}
