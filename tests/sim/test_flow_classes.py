"""Workload classes and flow control in the simulator (real SimPy runs): classes only label
the arrivals (the same arrivals as without them); per-class results; at 2x overload flow
control keeps the critical band within its objective while plain admission does not."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path
from typing import Any

from narwhal.sim.results import record_rows, summarize, write
from narwhal.sim.runner import run
from narwhal.sim.scenario import parse_scenario

SCENARIO = Path(__file__).resolve().parents[2] / "experiments" / "scenarios" / "flow-overload.toml"


def scenario(rate: float, flow: bool, classes: bool = True) -> Any:
    data = tomllib.loads(SCENARIO.read_text("utf-8"))
    data["workload"] = {**data["workload"], "rate": rate, "duration_s": 20.0}
    if not classes:
        data["workload"].pop("classes")
    data["flow"] = {**data["flow"], "enabled": flow}
    return parse_scenario(data)


def test_classes_label_the_same_arrivals() -> None:
    with_classes = run(scenario(6.0, False), 3)
    without = run(scenario(6.0, False, classes=False), 3)
    assert [(a.t, a.prompt, a.output) for a in with_classes.arrivals] == [
        (a.t, a.prompt, a.output) for a in without.arrivals
    ]
    names = [a.cls for a in with_classes.arrivals]
    assert set(names) == {"critical", "noisy", "sheddable"}
    assert 0.6 < names.count("sheddable") / len(names) < 0.9  # share 0.78
    assert {a.cls for a in without.arrivals} == {""}


def test_flow_control_keeps_the_critical_band_on_time_at_2x(tmp_path: Path) -> None:
    plain = summarize(run(scenario(24.0, False), 1))["classes"]
    result = run(scenario(24.0, True), 1)
    summary = write(result, tmp_path)
    flow = summary["classes"]
    assert set(flow["critical"]) == {
        "requests", "success_pct", "slo_attainment_pct", "slo_ttft_s", "shed", "first_byte_s",
    }  # fmt: skip
    for name in ("critical", "noisy"):
        assert flow[name]["slo_attainment_pct"] >= 90.0, flow
        assert plain[name]["slo_attainment_pct"] < 50.0, plain
    assert flow["sheddable"]["shed"] > 0 and plain["sheddable"]["shed"] == 0
    assert flow["critical"]["requests"] == plain["critical"]["requests"]
    assert flow["critical"]["first_byte_s"]["p90"] < plain["critical"]["first_byte_s"]["p90"]
    assert summary["flow"]["-1"]["refused"]["queue_ttl"] == flow["sheddable"]["shed"]
    with (tmp_path / "records.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    shed = [r for r in rows if r["outcome"] == "shed"]
    assert shed and all(r["engines"] == "" and r["attempts"] == "0" for r in shed)
    by_class = {name: sum(r["class"] == name for r in shed) for name in flow}
    assert by_class == {name: flow[name]["shed"] for name in flow}
    assert by_class["sheddable"] > 10 * (by_class["critical"] + by_class["noisy"])
    assert all("(queue_ttl)" in r["error"] for r in shed)
    assert "class critical" in (tmp_path / "summary.txt").read_text("utf-8")
    assert len(record_rows(result)) == len(rows)


def test_streamed_run_gives_the_same_classes(tmp_path: Path) -> None:
    kept = summarize(run(scenario(18.0, True), 2))
    streamed = summarize(run(scenario(18.0, True), 2, stream_to=tmp_path))
    assert streamed["classes"] == kept["classes"]
    header = (tmp_path / "records.csv").read_text("utf-8").splitlines()[0]
    assert header.endswith(",class")
