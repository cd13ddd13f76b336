"""What ships for operators holds to what the router exports: its /metrics pass
`promtool check metrics`, the alert rules pass `promtool check rules`, and every metric the
Grafana dashboard and the alerts query is one the router serves.

promtool comes with Debian's `prometheus` package (CI installs it and sets
NARWHAL_REQUIRE_PROMTOOL=1, so there a missing promtool fails instead of skipping).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from narwhal.core.records import Decision
from narwhal.live.metrics import RouterMetrics
from tests.compiled_stage import EXPECTED_BUILD
from tests.live.conftest import HTTP, Emulator, RouterHandle

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\b((?:narwhal|process)_[a-z0-9_]+)")
SERIES_SUFFIXES = ("_bucket", "_count", "_sum")
PROMQL_FUNCTIONS = {"histogram_quantile"}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("NARWHAL_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is required here (NARWHAL_REQUIRE_PROMTOOL) but not installed")
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    return found


@pytest.fixture
def scraped(router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]) -> str:
    """A live router's /metrics after a streamed and a plain request (every series present;
    flow control on, so its per-band families are there)."""
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": consumer.url, "role": "decode"},
        ],
        flow={"enabled": True, "saturation_gate": False},
    )  # fmt: skip  (its families too)
    for stream in (True, False):
        body = {"prompt": "hi", "max_tokens": 4, "stream": stream}
        assert HTTP.post(handle.url + "/v1/completions", json=body).status_code == 200
    return handle.metrics()


def _exported(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            total = kind == "counter" and not name.endswith("_total")
            names.add(name + "_total" if total else name)
            if kind == "histogram":
                names.update(name + suffix for suffix in SERIES_SUFFIXES)
    return names


def _queried() -> dict[str, set[str]]:
    """Metric names per query source: the dashboard's panels and the alert rules."""
    dashboard = json.loads((DEPLOY / "grafana" / "narwhal.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    alerts = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return {
        "dashboard": {m for e in exprs for m in METRIC.findall(e)} - PROMQL_FUNCTIONS,
        "alerts": {m for e in alerts for m in METRIC.findall(e)} - PROMQL_FUNCTIONS,
    }


def test_every_queried_metric_is_exported(scraped: str) -> None:
    exported = _exported(scraped)
    for source, names in _queried().items():
        assert names, source
        assert names <= exported, f"{source} queries metrics the router does not export"


def test_build_info_names_the_build_that_serves(scraped: str) -> None:
    (line,) = [line for line in scraped.splitlines() if line.startswith("narwhal_build_info{")]
    assert f'build="{EXPECTED_BUILD}"' in line and line.endswith(" 1.0")


def test_metrics_pass_promtool(scraped: str) -> None:
    checked = subprocess.run(
        [_promtool(), "check", "metrics"], input=scraped, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "_created" not in scraped  # a timestamp series per counter Prometheus does not use


def test_alert_rules_pass_promtool() -> None:
    checked = subprocess.run(
        [_promtool(), "check", "rules", str(DEPLOY / "prometheus" / "alerts.yaml")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_is_what_its_builder_writes() -> None:
    import runpy

    built: Any = runpy.run_path(str(DEPLOY / "grafana" / "build_dashboard.py"))["dashboard"]()
    assert json.loads((DEPLOY / "grafana" / "narwhal.json").read_text()) == built


def test_the_client_time_to_first_token_is_first_byte_s() -> None:
    """The histogram vLLM users graph as time to first token holds the client's first_byte_s;
    the prefill leg's ttft_s has its own name."""
    metrics = RouterMetrics()
    text = metrics.render().decode()
    assert "the contract's first_byte_s" in _help(text, "narwhal_time_to_first_token_seconds")
    assert "the contract's ttft_s" in _help(text, "narwhal_time_to_prefill_seconds")


def _help(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"# HELP {name} "))


def test_an_empty_stream_charged_is_counted_per_engine() -> None:
    """The core's ``empty_stream_charged`` decision (narwhal/core/empty_streams.py) is a counter
    by engine, so an operator sees which consumer answers ``[DONE]`` before any token."""
    metrics = RouterMetrics()
    for engine in ("http://c1", "http://c1", "http://c2"):
        metrics.on_decision(Decision(0.0, "empty_stream_charged", engine, (("request", "r"),)))
    text = metrics.render().decode()
    assert 'narwhal_empty_streams_charged_total{engine="http://c1"} 2.0' in text
    assert 'narwhal_empty_streams_charged_total{engine="http://c2"} 1.0' in text
