"""Results of a run: per-request records, engine state timelines, a summary, and the files.

Rule kept here: results are a pure function of a :class:`~narwhal.sim.runner.RunResult`, and
what is written is byte-identical for the same scenario and seed (no wall-clock values, fixed
key order, fixed float formatting); wall time is only printed.

Theory of operation: each core :class:`~narwhal.core.records.RequestRecord` is joined with its
arrival (prompt and output tokens) and given a TPOT: ``(finished_s - first_byte_s) /
(delivered_tokens - 1)`` for a completed stream, where ``delivered_tokens`` is what the engine
sent before ``[DONE]`` (``max_tokens``, or fewer after an early ``[DONE]``). An arrival with no
record (the run stopped at ``sim.max_sim_s`` first) is a row with outcome ``unfinished``. The
summary follows DistServe's definitions (Zhong et al., OSDI 2024): a request is on time when it
succeeded, its time to first token seen by the client (``first_byte_s``) is at most
``sim.slo_ttft_s`` and its TPOT at most ``sim.slo_tpot_s``; SLO attainment is the share of
requests on time. DistServe's goodput is the highest request rate whose attainment is at least
90%; it needs a sweep of rates (:func:`goodput_sweep`), so a single run reports its attainment
and whether it meets that bar, plus the on-time rate.

A streamed run (``run(..., stream_to=DIR)``, :mod:`narwhal.sim.streaming`) has already
written its rows, timeline and decisions; its summary comes from the counts kept as rows passed
and from percentiles selected exactly by re-reading ``records.csv``, so both kinds of run give
the same bytes.

Files: ``records.csv``, ``summary.json``, ``timeline.csv`` (per-engine samples),
``conditions.csv`` (engine-side fault states), ``faults.csv``, ``decisions.jsonl`` (the core's
decision log, one JSON object per line, for the sim-versus-live parity test) and
``summary.txt`` (the table that is printed).
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from narwhal.sim.classes import ClassStats, class_lines
from narwhal.sim.replicas import replica_summary
from narwhal.sim.runner import RunResult, run
from narwhal.sim.scenario import Scenario
from narwhal.sim.shared_context import SharedContextSettings
from narwhal.sim.streaming import (
    PERCENTILE_KEYS,
    RECORD_FIELDS,
    UNFINISHED,
    RowStats,
    exact_percentiles,
    read_percentile_columns,
    record_row,
    round6,
    unfinished_row,
)
from narwhal.sim.workload import trace_citation

GOODPUT_ATTAINMENT = 0.9  # DistServe's bar
__all__ = [
    "GOODPUT_ATTAINMENT",
    "RECORD_FIELDS",
    "UNFINISHED",
    "engine_settings",
    "goodput",
    "goodput_sweep",
    "percentile",
    "prefix_cache_hit_rate",
    "record_rows",
    "summarize",
    "table",
    "write",
]


def record_rows(result: RunResult) -> list[dict[str, Any]]:
    """One row per arrival, in arrival order; a request the run stopped before it ended (at
    ``sim.max_sim_s``) is a row with outcome ``unfinished`` and no status. A streamed run has
    its rows in ``records.csv`` only."""
    if result.streamed is not None:
        raise ValueError("a streamed run's rows are in its records.csv")
    delivered = {rid.rsplit("-", 1)[0]: n for rid, n in result.delivered.items()}
    rows: dict[int, dict[str, Any]] = {}
    for record in result.records:
        index = int(record.request_id.rsplit("-", 1)[1])
        rows[index] = record_row(record, result.arrivals[index], delivered)
    return [
        rows[index] if index in rows else unfinished_row(index, arrival)
        for index, arrival in enumerate(result.arrivals)
    ]


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(result: RunResult, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    sim = result.scenario.sim
    streamed = result.streamed
    if streamed is not None:
        stats, decisions = streamed.stats, streamed.decision_kinds
        per_class = streamed.classes
        path = streamed.out / "records.csv"

        def columns() -> Iterable[tuple[float | None, ...]]:
            return read_percentile_columns(path)  # re-read: the rows are not held

    else:
        rows = rows if rows is not None else record_rows(result)
        stats = RowStats(sim.slo_ttft_s, sim.slo_tpot_s)
        classes = result.scenario.workload.classes
        per_class = ClassStats(classes, sim.slo_ttft_s, sim.slo_tpot_s) if classes else None
        for row in rows:
            stats.add(row)
            if per_class is not None:
                per_class.add(row)
        decisions = Counter(d["kind"] for d in result.decisions)
        kept = rows

        def columns() -> Iterable[tuple[float | None, ...]]:
            return (tuple(r[k] for k in PERCENTILE_KEYS) for r in kept if r["status"] == 200)

    n = stats.rows
    span = result.last_arrival_s - result.first_arrival_s if result.requests > 1 else 0.0
    found = exact_percentiles(
        columns,
        [stats.counts[k] for k in PERCENTILE_KEYS],
        [stats.largest[k] for k in PERCENTILE_KEYS],
        (50.0, 99.0),
    )
    pcts = {
        key: [round6(v) for v in values] for key, values in zip(PERCENTILE_KEYS, found, strict=True)
    }

    def pct(key: str, q: float) -> float | None:
        return pcts[key][0 if q == 50 else 1]

    attainment = stats.on_time / n if n else 0.0
    engines = result.engines
    summary: dict[str, Any] = {
        "scenario": result.scenario.name,
        "seed": result.seed,
        "requests": n,
        "stream": result.scenario.workload.stream,  # False: clients get whole responses
        "succeeded": stats.succeeded,
        "success_pct": round(100.0 * stats.succeeded / n, 3) if n else 0.0,
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "unfinished": stats.unfinished,
        "errors_by_class": dict(sorted(stats.errors.items())),
        "retried_requests": stats.retried,
        "offered_rps": round(n / span, 3) if span > 0 else None,
        "ttft_s": {"p50": pct("ttft_s", 50), "p99": pct("ttft_s", 99)},
        "first_byte_s": {"p50": pct("first_byte_s", 50), "p99": pct("first_byte_s", 99)},
        "tpot_s": {"p50": pct("tpot_s", 50), "p99": pct("tpot_s", 99)},
        "slo": {"ttft_s": sim.slo_ttft_s, "tpot_s": sim.slo_tpot_s},
        "on_time": stats.on_time,
        "slo_attainment_pct": round(100.0 * attainment, 3),
        "meets_goodput_bar": attainment >= GOODPUT_ATTAINMENT,
        "on_time_rps": round(stats.on_time / span, 3) if span > 0 else None,
        "ejections": sum(e["times_ejected"] for e in engines.values()),
        "ejections_by_engine": {
            u: e["times_ejected"] for u, e in engines.items() if e["times_ejected"]
        },
        "readmissions": decisions.get("readmit"),
        "probes": decisions.get("probe"),
        "ejections_capped": decisions.get("eject_capped", 0),
        "quarantine_fallbacks": decisions.get("quarantine_fallback", 0),
        "preemptions": sum(e["preemptions"] for e in engines.values()),
        "prefix_cache_hit_rate": prefix_cache_hit_rate(engines),
        "fault_windows": len(result.fault_windows),
        "sim_time_s": round6(result.sim_end_s),
        "engine_utilization": {
            u: round(e["busy_s"] / result.sim_end_s, 4) if result.sim_end_s else 0.0
            for u, e in engines.items()
        },
    }
    summary.update(engine_settings(result))
    if per_class is not None:  # [[workload.classes]]
        summary["classes"] = per_class.summary()
    if result.flow:  # [flow] enabled: per band, replica 0's queues
        summary["flow"] = result.flow
    if result.scenario.router.recovery.resume_streams:  # [recovery] resume_streams
        summary["resumed_requests"] = stats.resumed
        summary["resume_refused"] = dict(sorted(stats.resume_refused.items()))
    if result.replica_ejections:  # several router replicas ([router] replicas > 1)
        per_replica = (
            streamed.replica_counts.summary(result.replica_ejections)
            if streamed is not None
            else replica_summary(
                result.replica_of,
                result.records,
                len(result.replica_ejections),
                result.replica_ejections,
            )
        )
        summary["replicas"] = {"spread": result.scenario.replicas.spread, **per_replica}
    workload = result.scenario.workload
    if workload.kind == "trace" or (
        workload.kind in ("poisson", "gamma") and workload.prompt is None
    ):
        summary["trace"] = f"{workload.trace}: {trace_citation(workload.trace)}"
    return summary


def engine_settings(result: RunResult) -> dict[str, Any]:
    """What every simulated engine ran with, and how that departs from vLLM's own defaults."""
    fleet = result.scenario.fleet
    params = fleet.engine_params()
    return {
        "engine_settings": {
            "gpu": fleet.device_name,
            "max_num_seqs": params.max_num_seqs,
            "max_num_batched_tokens": params.max_num_batched_tokens,
            "num_blocks": params.num_blocks,
            "block_size": params.block_size,
        },
        "vllm_notes": fleet.vllm_notes(),
    }


def prefix_cache_hit_rate(engines: dict[str, dict[str, Any]]) -> float:
    """Prompt tokens served from a prefix cache / prompt tokens looked up, over every engine
    (vLLM's ``vllm:prefix_cache_hits / vllm:prefix_cache_queries``: a producer's prefills, a
    consumer's pulls and local prefills); 0 when none was looked up (prefix caching off)."""
    queries = sum(e["prefix_cache_queries"] for e in engines.values())
    hits = sum(e["prefix_cache_hits"] for e in engines.values())
    return round(hits / queries, 6) if queries else 0.0


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * 1e3:.1f} ms" if unit == "ms" else f"{value:g}"
    return str(value)


def table(summary: dict[str, Any]) -> str:
    """A readable table of the summary."""
    per = ", ".join(f"{u}: {n}" for u, n in summary["ejections_by_engine"].items())
    by_engine = f"({per})" if per else ""
    lines = [
        ("scenario", f"{summary['scenario']} (seed {summary['seed']})"),
        ("requests", f"{summary['requests']} ({_fmt(summary['offered_rps'])} req/s offered)"),
        ("succeeded", f"{summary['succeeded']} ({summary['success_pct']:.2f}%)"),
        ("statuses", ", ".join(f"{k}: {v}" for k, v in summary["statuses"].items()) or "-"),
        (
            "errors by class",
            ", ".join(f"{k}: {v}" for k, v in summary["errors_by_class"].items()) or "-",
        ),
        ("retried requests", str(summary["retried_requests"])),
        (
            # a non-streaming client sees nothing before the end: first_byte_s is the router's
            "TTFT at client p50/p99" if summary["stream"] else "first token (router) p50/p99",
            f"{_fmt(summary['first_byte_s']['p50'], 'ms')} / "
            f"{_fmt(summary['first_byte_s']['p99'], 'ms')}",
        ),
        (
            "prefill leg p50/p99",
            f"{_fmt(summary['ttft_s']['p50'], 'ms')} / {_fmt(summary['ttft_s']['p99'], 'ms')}",
        ),
        (
            "TPOT p50/p99",
            f"{_fmt(summary['tpot_s']['p50'], 'ms')} / {_fmt(summary['tpot_s']['p99'], 'ms')}",
        ),
        ("SLO (TTFT, TPOT)", f"{summary['slo']['ttft_s']:g} s, {summary['slo']['tpot_s']:g} s"),
        (
            "SLO attainment",
            f"{summary['slo_attainment_pct']:.2f}% "
            f"({'meets' if summary['meets_goodput_bar'] else 'below'} the 90% bar; "
            f"{_fmt(summary['on_time_rps'])} on-time req/s)",
        ),
        ("ejections", f"{summary['ejections']} {by_engine}".rstrip()),
        ("readmissions / probes", f"{_fmt(summary['readmissions'])} / {_fmt(summary['probes'])}"),
        (
            "capped / fallbacks",
            f"{summary['ejections_capped']} / {summary['quarantine_fallbacks']}",
        ),
        ("preemptions", str(summary["preemptions"])),
        ("prefix cache hit rate", f"{100 * summary['prefix_cache_hit_rate']:.2f}%"),
        ("fault windows", str(summary["fault_windows"])),
        ("simulated time", f"{summary['sim_time_s']:.1f} s"),
    ]
    if summary["unfinished"]:
        lines.insert(
            3, ("unfinished", f"{summary['unfinished']} (the run stopped at sim.max_sim_s)")
        )
    engine = summary["engine_settings"]
    lines.append(
        (
            "engines",
            f"max_num_seqs {engine['max_num_seqs']}, max_num_batched_tokens "
            f"{engine['max_num_batched_tokens']}, {engine['num_blocks']:,} KV blocks of "
            f"{engine['block_size']} ({engine['gpu']})",
        )
    )
    lines.extend(("vs vLLM", note) for note in summary["vllm_notes"])
    if "replicas" in summary:
        replicas = summary["replicas"]
        lines.append(
            (
                f"router replicas ({replicas['spread']})",
                f"{replicas['count']}: requests {replicas['requests']}, "
                f"ejections {replicas['ejections']}",
            )
        )
    if "trace" in summary:
        lines.append(("trace", summary["trace"]))
    lines.extend(class_lines(summary.get("classes", {})))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines) + "\n"


def _csv(rows: list[dict[str, Any]], fields: tuple[str, ...] | list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in fields})
    return buffer.getvalue()


def write(result: RunResult, out: Path) -> dict[str, Any]:
    """Write every result file into ``out`` (a streamed run has written its records, timeline
    and decisions there already); returns the summary."""
    streamed = result.streamed is not None
    if result.streamed is not None and result.streamed.out.resolve() != out.resolve():
        raise ValueError(f"the run was streamed to {result.streamed.out}, not {out}")
    out.mkdir(parents=True, exist_ok=True)
    rows = None if streamed else record_rows(result)
    summary = summarize(result, rows)
    if rows is not None:
        fields = (*RECORD_FIELDS, "class") if result.scenario.workload.classes else RECORD_FIELDS
        (out / "records.csv").write_text(_csv(rows, fields), "utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    (out / "summary.txt").write_text(table(summary), "utf-8")
    if result.samples:
        (out / "timeline.csv").write_text(_csv(result.samples, list(result.samples[0])), "utf-8")
    (out / "conditions.csv").write_text(
        _csv(result.conditions, ("t", "engine", "condition")), "utf-8"
    )
    (out / "faults.csv").write_text(
        _csv(
            [w.as_dict() for w in result.fault_windows],
            ("engine", "kind", "start", "end", "factor", "probability", "after_tokens"),
        ),
        "utf-8",
    )
    if not streamed:
        with (out / "decisions.jsonl").open("w", encoding="utf-8") as handle:
            for decision in result.decisions:
                handle.write(json.dumps(decision, sort_keys=True) + "\n")
    return summary


def goodput(curve: list[tuple[float, float]], bar_pct: float = 90.0) -> tuple[float, str]:
    """DistServe goodput from (offered rate, attainment %) points in increasing rate: the rate
    where attainment first falls below ``bar_pct``, interpolated between the two points around
    that crossing (a later point back above the bar does not count: the rate is not sustained).
    The bound is "below" when even the first point misses the bar (goodput 0), "above" when
    none does (goodput is at least the last rate), else ""."""
    if not curve:
        return 0.0, "below"
    for k, (rate, attained) in enumerate(curve):
        if attained < bar_pct:
            if k == 0:
                return 0.0, "below"
            low_rate, low_attained = curve[k - 1]
            share = (low_attained - bar_pct) / (low_attained - attained)
            return low_rate + share * (rate - low_rate), ""
    return curve[-1][0], "above"


def goodput_sweep(
    scenario: Scenario, scales: list[float], seed: int | None = None
) -> dict[str, Any]:
    """DistServe goodput: run the scenario at each rate scale and find where SLO attainment
    falls below 90% (:func:`goodput`, the same as ``narwhal sweep``'s). Scales multiply the
    trace's ``rate_scale`` or the synthetic ``rate``, or divide the ``fixed`` arrival times."""
    points = []
    for scale in sorted(scales):
        w = scenario.workload
        update: dict[str, Any]
        if w.kind == "trace":
            update = {"rate_scale": w.rate_scale * scale}
        elif w.kind == "fixed":
            update = {"arrivals_s": tuple(t / scale for t in w.arrivals_s or ())}
        elif w.kind == "shared_context":
            update = {"shared_context": (w.shared_context or SharedContextSettings()).scaled(scale)}
        else:
            update = {"rate": w.rate * scale}
        scaled = scenario.model_copy(update={"workload": w.model_copy(update=update)})
        summary = summarize(run(scaled, seed))
        points.append(
            {
                "scale": scale,
                "offered_rps": summary["offered_rps"],
                "slo_attainment_pct": summary["slo_attainment_pct"],
            }
        )
    curve = [(p["offered_rps"] or 0.0, p["slo_attainment_pct"]) for p in points]
    value, bound = goodput(curve, 100 * GOODPUT_ATTAINMENT)
    return {"points": points, "goodput_rps": value, "bound": bound}
