"""Results of a run: per-request records, engine state timelines, a summary, and the files.

Rule kept here: results are a pure function of a :class:`~narwhal.sim.runner.RunResult`, and
what is written is byte-identical for the same scenario and seed (no wall-clock values, fixed
key order, fixed float formatting); wall time is only printed.

Theory of operation: each core :class:`~narwhal.core.records.RequestRecord` is joined with its
arrival (prompt and output tokens) and given a TPOT: ``(finished_s - first_byte_s) /
(output_tokens - 1)`` for a completed stream (the simulated engine generates exactly
``max_tokens``). The summary follows DistServe's definitions (FACTS.md section 6): a request is
on time when it succeeded, its time to first token seen by the client (``first_byte_s``) is at
most ``sim.slo_ttft_s`` and its TPOT at most ``sim.slo_tpot_s``; SLO attainment is the share of
requests on time. DistServe's goodput is the highest request rate whose attainment is at least
90%; it needs a sweep of rates (:func:`goodput_sweep`), so a single run
reports its attainment and whether it meets that bar, plus the on-time rate.

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
from pathlib import Path
from typing import Any

from narwhal.sim.runner import RunResult, run
from narwhal.sim.scenario import Scenario
from narwhal.sim.workload import TRACE_CITATION

GOODPUT_ATTAINMENT = 0.9  # DistServe's bar
RECORD_FIELDS = (
    "request_id",
    "arrival",
    "status",
    "outcome",
    "committed",
    "ttft_s",
    "first_byte_s",
    "tpot_s",
    "finished_s",
    "attempts",
    "engines",
    "prompt_tokens",
    "output_tokens",
    "output_events",
    "error",
)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def record_rows(result: RunResult) -> list[dict[str, Any]]:
    """One row per request, in arrival order."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for record in result.records:
        index = int(record.request_id.rsplit("-", 1)[1])
        arrival = result.arrivals[index]
        tpot = None
        if record.status == 200 and record.first_byte_s is not None and arrival.output > 1:
            tpot = (record.finished_s - record.first_byte_s) / (arrival.output - 1)
        rows.append(
            (
                index,
                {
                    "request_id": record.request_id,
                    "arrival": _round(record.arrival),
                    "status": record.status,
                    "outcome": record.outcome,
                    "committed": record.committed,
                    "ttft_s": _round(record.ttft_s),
                    "first_byte_s": _round(record.first_byte_s),
                    "tpot_s": _round(tpot),
                    "finished_s": _round(record.finished_s),
                    "attempts": record.attempts,
                    "engines": " ".join(record.engines),
                    "prompt_tokens": arrival.prompt,
                    "output_tokens": arrival.output,
                    "output_events": record.output_tokens,
                    "error": record.error,
                },
            )
        )
    rows.sort(key=lambda item: item[0])
    return [row for _, row in rows]


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
    rows = rows if rows is not None else record_rows(result)
    sim = result.scenario.sim
    n = len(rows)
    ok = [r for r in rows if r["status"] == 200]
    on_time = [
        r
        for r in ok
        if r["first_byte_s"] is not None
        and r["first_byte_s"] <= sim.slo_ttft_s
        and (r["tpot_s"] is None or r["tpot_s"] <= sim.slo_tpot_s)
    ]
    span = (result.arrivals[-1].t - result.arrivals[0].t) if len(result.arrivals) > 1 else 0.0

    def pct(key: str, q: float) -> float | None:
        return _round(percentile([r[key] for r in ok if r[key] is not None], q))

    attainment = len(on_time) / n if n else 0.0
    decisions = Counter(d["kind"] for d in result.decisions)
    engines = result.engines
    summary: dict[str, Any] = {
        "scenario": result.scenario.name,
        "seed": result.seed,
        "requests": n,
        "succeeded": len(ok),
        "success_pct": round(100.0 * len(ok) / n, 3) if n else 0.0,
        "statuses": {str(k): v for k, v in sorted(Counter(r["status"] for r in rows).items())},
        "errors_by_class": dict(
            sorted(Counter(r["outcome"] for r in rows if r["status"] != 200).items())
        ),
        "retried_requests": sum(1 for r in rows if r["attempts"] > 1),
        "offered_rps": round(n / span, 3) if span > 0 else None,
        "ttft_s": {"p50": pct("ttft_s", 50), "p99": pct("ttft_s", 99)},
        "first_byte_s": {"p50": pct("first_byte_s", 50), "p99": pct("first_byte_s", 99)},
        "tpot_s": {"p50": pct("tpot_s", 50), "p99": pct("tpot_s", 99)},
        "slo": {"ttft_s": sim.slo_ttft_s, "tpot_s": sim.slo_tpot_s},
        "on_time": len(on_time),
        "slo_attainment_pct": round(100.0 * attainment, 3),
        "meets_goodput_bar": attainment >= GOODPUT_ATTAINMENT,
        "on_time_rps": round(len(on_time) / span, 3) if span > 0 else None,
        "ejections": sum(e["times_ejected"] for e in engines.values()),
        "ejections_by_engine": {
            u: e["times_ejected"] for u, e in engines.items() if e["times_ejected"]
        },
        "readmissions": decisions.get("readmit"),
        "probes": decisions.get("probe"),
        "preemptions": sum(e["preemptions"] for e in engines.values()),
        "fault_windows": len(result.fault_windows),
        "sim_time_s": _round(result.sim_end_s),
        "engine_utilization": {
            u: round(e["busy_s"] / result.sim_end_s, 4) if result.sim_end_s else 0.0
            for u, e in engines.items()
        },
    }
    if result.scenario.workload.kind == "trace" or result.scenario.workload.prompt is None:
        summary["trace"] = f"{result.scenario.workload.trace}: {TRACE_CITATION}"
    return summary


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
        ("statuses", ", ".join(f"{k}: {v}" for k, v in summary["statuses"].items())),
        (
            "errors by class",
            ", ".join(f"{k}: {v}" for k, v in summary["errors_by_class"].items()) or "-",
        ),
        ("retried requests", str(summary["retried_requests"])),
        (
            "TTFT at client p50/p99",
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
        ("preemptions", str(summary["preemptions"])),
        ("fault windows", str(summary["fault_windows"])),
        ("simulated time", f"{summary['sim_time_s']:.1f} s"),
    ]
    if "trace" in summary:
        lines.append(("trace", summary["trace"]))
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
    """Write every result file into ``out``; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    rows = record_rows(result)
    summary = summarize(result, rows)
    (out / "records.csv").write_text(_csv(rows, RECORD_FIELDS), "utf-8")
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
    with (out / "decisions.jsonl").open("w", encoding="utf-8") as handle:
        for decision in result.decisions:
            handle.write(json.dumps(decision, sort_keys=True) + "\n")
    return summary


def goodput_sweep(
    scenario: Scenario, scales: list[float], seed: int | None = None
) -> dict[str, Any]:
    """DistServe goodput: run the scenario at each rate scale; the highest offered rate whose
    SLO attainment is at least 90%. Scales multiply the trace's ``rate_scale`` or the
    synthetic ``rate``, or divide the ``fixed`` arrival times."""
    points = []
    for scale in sorted(scales):
        w = scenario.workload
        update: dict[str, Any]
        if w.kind == "trace":
            update = {"rate_scale": w.rate_scale * scale}
        elif w.kind == "fixed":
            update = {"arrivals_s": tuple(t / scale for t in w.arrivals_s or ())}
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
    good = [p for p in points if p["slo_attainment_pct"] >= 100 * GOODPUT_ATTAINMENT]
    best = max((p["offered_rps"] or 0.0 for p in good), default=None)
    return {"points": points, "goodput_rps": best}
