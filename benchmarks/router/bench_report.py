"""What a router benchmark prints and writes: percentiles, text tables, the report, the CSV.

``pct`` is the nearest-rank percentile every figure uses (None for no values); ``ms``, ``ratio``
and ``table`` format them. ``report`` turns the results of benchmarks/router/routers.py into its
tables (TTFT, throughput, fault goodput, the Narwhal / peer ratios, the py-spy profile);
``write_csv`` writes the same results in long format (phase, target, metric, value).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from bench_routers import COMPILED


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(results: dict[str, Any]) -> str:
    out: list[str] = []
    ovh = results.get("overhead")
    names = results["routers"]
    if ovh:
        rows = []
        for name in ["direct", "direct-pd", *ovh["names"]]:
            t = ovh["ttft"][name]
            rows.append(
                [
                    name,
                    t["n"],
                    ms(t["p50_s"]),
                    ms(t["p99_s"]),
                    ms(t["added_p50_s"]),
                    ms(t["added_p99_s"]),
                ]
            )
        out.append(
            "Time to first token, ms (concurrency 1, 16 tokens, targets interleaved; "
            "direct = decode-only on the engine, direct-pd = the client does the P/D legs)"
        )
        out.append(
            table(["target", "n", "p50", "p99", "added p50 vs direct", "added p99 vs direct"], rows)
        )
        rows = []
        for name in ["direct", "direct-pd", *ovh["names"]]:
            t = ovh["streaming"][name]
            q = ovh["requests"].get(name, {})
            rows.append(
                [
                    name,
                    _num(t["chunks_per_s"], ".0f"),
                    _num(t["router_cores_busy"], ".2f"),
                    _num(t["chunks_per_cpu_s"], ".0f"),
                    _num(t["cpu_ms_per_1000_chunks"], ".1f"),
                    _num(t.get("ttft_p50_ms"), ".1f"),
                    _num(q.get("requests_per_s"), ".0f"),
                    _num(q.get("cpu_ms_per_request"), ".2f"),
                    _num(q.get("decode_conns_closed_per_100_requests"), ".0f"),
                    t["outcomes"].get("ok", 0) + q.get("outcomes", {}).get("ok", 0),
                    sum(v for k, v in t["outcomes"].items() if k != "ok")
                    + sum(v for k, v in q.get("outcomes", {}).items() if k != "ok"),
                ]
            )
        settings = results["settings"]
        out.append("")
        out.append(
            f"Throughput ({settings['tput_concurrency']} closed-loop streams; streaming = "
            f"{settings['tput_tokens']} tokens/request, requests = 1 token/request; CPU = the "
            "router's process group)"
        )
        out.append(
            table(
                ["target", "chunks/s", "router cores busy", "chunks/s per router core",
                 "router CPU ms / 1000 chunks", "streaming TTFT p50 ms", "1-token req/s",
                 "router CPU ms / request",
                 "decode conns closed / 100 req", "ok", "not ok"],
                rows,
            )
        )  # fmt: skip
    flt = results.get("faults")
    if flt:
        rows = []
        for name in names:
            f = flt[name]
            rows.append(
                [
                    name,
                    f["requests"],
                    f"{f['success_pct']:.1f}",
                    f["errors"],
                    f["wrong_200"],
                    f["hung"],
                    f"{f['p50_latency_s']:.3f}",
                    f"{f['p99_latency_s']:.2f}",
                    _num(f["p99_ok_latency_s"], ".3f"),
                ]
            )
        out.append("")
        out.append(
            f"Fault goodput (hung = not finished after {results['settings']['fault_bound']:.0f} s; "
            "latency over all requests, a hung one counted at the bound)"
        )
        out.append(
            table(
                ["router", "requests", "success %", "errors", "wrong-but-200", "hung",
                 "p50 latency s", "p99 latency s", "p99 ok latency s"],
                rows,
            )
        )  # fmt: skip
    narwhals = ["narwhal"] + ([COMPILED] if ovh and COMPILED in ovh["ttft"] else [])
    if "narwhal" in names and len(names) > 1:
        rows = []
        for peer, narwhal in [(n, w) for w in narwhals for n in names if n != "narwhal"]:
            row = [f"{narwhal} / {peer}"]
            if ovh:
                nt, pt = ovh["ttft"][narwhal], ovh["ttft"][peer]
                ns, ps = ovh["streaming"][narwhal], ovh["streaming"][peer]
                nr, pr = ovh["requests"][narwhal], ovh["requests"][peer]
                row += [
                    ratio(nt["added_p50_s"], pt["added_p50_s"]),
                    ratio(nt["added_p99_s"], pt["added_p99_s"]),
                    ratio(ns["chunks_per_cpu_s"], ps["chunks_per_cpu_s"]),
                    ratio(ns["cpu_ms_per_1000_chunks"], ps["cpu_ms_per_1000_chunks"]),
                    ratio(nr["cpu_ms_per_request"], pr["cpu_ms_per_request"]),
                ]
            else:
                row += ["-"] * 5
            if flt and narwhal == "narwhal":
                nf, pf = flt["narwhal"], flt[peer]
                row += [
                    ratio(nf["success_pct"], pf["success_pct"]),
                    f"{nf['wrong_200']} vs {pf['wrong_200']}",
                    f"{nf['hung']} vs {pf['hung']}",
                    ratio(nf["p99_latency_s"], pf["p99_latency_s"]),
                ]
            else:
                row += ["-"] * 4
            rows.append(row)
        out.append("")
        out.append(
            "Ratios Narwhal / peer, same run (better: lower, except chunks/s/core and success)"
        )
        out.append(
            table(
                ["pair", "added TTFT p50", "added TTFT p99", "chunks/s/core",
                 "CPU / 1000 chunks", "CPU / request", "success %", "wrong-200", "hung",
                 "fault p99 latency"],
                rows,
            )
        )  # fmt: skip
    prof = results.get("profile")
    if prof:
        for label, data in prof.items():
            out.append("")
            out.append(
                f"Narwhal under py-spy, {label} load ({data['max_tokens']} tokens/request, "
                f"{data['chunks_per_s']:.0f} chunks/s, {data['requests_per_s']:.0f} req/s, "
                f"{data['samples']} samples; decode connections closed per 100 requests: "
                f"{_num(data.get('decode_conns_closed_per_100_requests'), '.0f')})"
            )
            out.append(table(["package (self time)", "%"], data["self_by_package_pct"][:10]))
            out.append(table(["function (self time)", "%"], data["self_by_function_pct"][:15]))
            out.append(
                table(
                    ["narwhal function (inclusive)", "%"],
                    data["inclusive_narwhal_functions_pct"][:14],
                )
            )
    return "\n".join(out)


def write_csv(path: Path, results: dict[str, Any]) -> None:
    rows: list[list[Any]] = []
    ovh = results.get("overhead") or {}
    for name, data in ovh.get("ttft", {}).items():
        for key, value in data.items():
            if key != "outcomes":
                rows.append(["ttft", name, key, value])
    for workload in ("streaming", "requests"):
        for name, data in ovh.get(workload, {}).items():
            for key, value in data.items():
                if key not in ("outcomes", "rounds_chunks_per_cpu_s"):
                    rows.append([workload, name, key, value])
    for name, data in (results.get("faults") or {}).items():
        for key in (
            "requests",
            "success_pct",
            "errors",
            "wrong_200",
            "hung",
            "p50_latency_s",
            "p99_latency_s",
            "p99_ok_latency_s",
            "max_latency_s",
        ):
            rows.append(["faults", name, key, data[key]])  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["phase", "target", "metric", "value"])
        writer.writerows(rows)
