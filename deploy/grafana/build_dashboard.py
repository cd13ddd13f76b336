"""Writes deploy/grafana/narwhal.json, the router's Grafana dashboard, from the panel list below
(so the JSON is never edited by hand): ``python3 deploy/grafana/build_dashboard.py``.
tests/test_observability.py checks that every query names a metric the router exports."""

from __future__ import annotations

import json
from pathlib import Path

RATE = "[$__rate_interval]"
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    # (title, unit, [(PromQL, legend)])
    ("Requests by status", "reqps", [
        (f"sum by (status) (rate(narwhal_requests_total{RATE}))", "{{status}}"),
    ]),
    ("Success ratio", "percentunit", [
        (f'sum(rate(narwhal_requests_total{{status="200"}}{RATE}))'
         f" / sum(rate(narwhal_requests_total{RATE}))", "200 / all"),
    ]),
    ("Time to first token at the client (first_byte_s)", "s", [
        (f"histogram_quantile({q}, sum by (le) "
         f"(rate(narwhal_time_to_first_token_seconds_bucket{RATE})))", f"p{int(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]),
    ("Time to prefill (ttft_s) and end to end", "s", [
        (f"histogram_quantile(0.99, sum by (le) "
         f"(rate(narwhal_time_to_prefill_seconds_bucket{RATE})))", "prefill p99"),
        (f"histogram_quantile(0.99, sum by (le) "
         f"(rate(narwhal_e2e_request_latency_seconds_bucket{RATE})))", "end to end p99"),
    ]),
    ("Time per output token", "s", [
        (f"histogram_quantile({q}, sum by (le) "
         f"(rate(narwhal_time_per_output_token_seconds_bucket{RATE})))", f"p{int(q * 100)}")
        for q in (0.5, 0.99)
    ]),
    ("Requests, prompt and generated tokens by model", "short", [
        (f"sum by (model) (rate(narwhal_requests_total{RATE}))", "requests/s {{model}}"),
        (f"sum by (model) (rate(narwhal_prompt_tokens_total{RATE}))",
         "prompt tokens/s {{model}}"),
        (f"sum by (model) (rate(narwhal_generation_tokens_total{RATE}))",
         "generated tokens/s {{model}}"),
    ]),
    ("Engines by state", "short", [
        ('sum by (role, state) (narwhal_engine_state == 1)', "{{role}} {{state}}"),
    ]),
    ("Ejections, readmissions, capped ejections", "short", [
        (f"sum by (engine) (increase(narwhal_ejections_total{RATE}))", "ejected {{engine}}"),
        (f"sum by (engine) (increase(narwhal_readmissions_total{RATE}))", "readmitted {{engine}}"),
        (f"sum by (engine) (increase(narwhal_ejections_capped_total{RATE}))", "capped {{engine}}"),
    ]),
    ("Retries and quarantine fallbacks", "short", [
        (f"sum by (fault) (rate(narwhal_retries_total{RATE}))", "retry {{fault}}"),
        (f"sum by (phase) (rate(narwhal_quarantine_fallbacks_total{RATE}))",
         "fallback {{phase}}"),
    ]),
    ("In flight", "short", [
        ("narwhal_requests_in_flight", "requests"),
        ("narwhal_retries_in_flight", "retries"),
        ("sum by (engine) (narwhal_reservations_in_flight)", "reserved {{engine}}"),
    ]),
    ("Flow control by band ([flow] enabled)", "short", [
        ("sum by (band) (narwhal_flow_queue_length)", "queued {{band}}"),
        (f"sum by (band, reason) (rate(narwhal_flow_refused_total{RATE}))",
         "shed/s {{band}} {{reason}}"),
        (f"sum by (band) (rate(narwhal_flow_wait_seconds_total{RATE}))"
         f" / sum by (band) (rate(narwhal_flow_dispatched_total{RATE}))", "mean wait s {{band}}"),
    ]),
    ("Flow control by fairness flow (the heaviest flows; the rest as other)", "short", [
        ("sum by (flow) (narwhal_flow_fairness_queue_length)", "queued {{flow}}"),
        (f"sum by (flow, reason) (rate(narwhal_flow_fairness_refused_total{RATE}))",
         "shed/s {{flow}} {{reason}}"),
        (f"sum by (flow) (rate(narwhal_flow_fairness_wait_seconds_total{RATE}))"
         f" / sum by (flow) (rate(narwhal_flow_fairness_dispatched_total{RATE}))",
         "mean wait s {{flow}}"),
    ]),
    ("Client connections (per router process)", "short", [
        ("sum by (instance) (narwhal_client_connections_open)", "open {{instance}}"),
        ("max by (instance) (narwhal_client_connections_limit)", "bound {{instance}}"),
        ("sum by (instance) (narwhal_client_connections_reading_body)",
         "reading a body {{instance}}"),
        (f"sum by (instance) (rate(narwhal_client_connections_refused_total{RATE}))",
         "refused/s {{instance}}"),
    ]),
    ("Router process", "short", [
        (f"rate(process_cpu_seconds_total{RATE})", "CPU cores"),
        ("process_resident_memory_bytes / 2^20", "RSS MiB"),
    ]),
]  # fmt: skip


def dashboard() -> dict[str, object]:
    panels = []
    for index, (title, unit, queries) in enumerate(PANELS):
        panels.append({
            "id": index + 1,
            "title": title,
            "type": "timeseries",
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                for i, (expr, legend) in enumerate(queries)
            ],
        })  # fmt: skip
    return {
        "title": "Narwhal router",
        "uid": "narwhal-router",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]
        },
        "panels": panels,
    }


if __name__ == "__main__":
    path = Path(__file__).with_name("narwhal.json")
    path.write_text(json.dumps(dashboard(), indent=2) + "\n", "utf-8")
    print(path)
