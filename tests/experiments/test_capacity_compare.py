"""The old-against-new capacity comparison: it pairs two capacity sweeps' files, writes the PNG
and the CSV of what it draws, and refuses sweeps that do not cover the same points; the old
model's recipe is the capacity sweep with only the engine settings pinned."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from narwhal.experiments.aggregate import csv_text
from narwhal.experiments.figures.capacity_compare import main
from narwhal.experiments.plan import build_plan
from narwhal.experiments.spec import load_spec
from narwhal.sim.scenario import parse_scenario
from narwhal.sim.tensor_parallel import TensorParallelStep
from narwhal.sim.timing import step_model
from tests.experiments.conftest import EXPERIMENTS

FIELDS = ["fleet_size", "pd_ratio", "prefill", "decode", "rate_multiplier", "offered_rps",
          "offered_rps_per_engine", "slo_attainment_pct", "success_pct", "goodput_rps",
          "goodput_rps_sd", "goodput_per_engine", "goodput_bound"]  # fmt: skip
OLD_PINS = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "kv_cache_tokens": 1118454,
    "tp_allreduce": False,
    "link_bandwidth_gbps": 10.0,
}


def _write_sweep(folder: Path, name: str, goodput: dict[tuple[int, str], tuple[float, str]],
                 attainment_drop: float) -> None:  # fmt: skip
    """A finished capacity sweep's files: 2 sizes x 2 ratios x 2 rates, as the recipe writes."""
    rows: list[dict[str, Any]] = []
    for (size, ratio), (rps, bound) in goodput.items():
        prefill = size // 2 if ratio == "1:1" else size * 3 // 4
        for multiplier in (0.5, 1.0):
            offered = 2.0 * multiplier * size
            rows.append(
                {"fleet_size": size, "pd_ratio": ratio, "prefill": prefill,
                 "decode": size - prefill, "rate_multiplier": multiplier, "offered_rps": offered,
                 "offered_rps_per_engine": offered / size,
                 "slo_attainment_pct": 100.0 - attainment_drop * multiplier,
                 "success_pct": 100.0, "goodput_rps": rps, "goodput_rps_sd": 0.5,
                 "goodput_per_engine": rps / size, "goodput_bound": bound}
            )  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "capacity.csv").write_text(csv_text(FIELDS, rows), "utf-8")
    meta = {"name": name, "spec": f"experiments/{name}.toml", "quick": False, "runs": 24,
            "simulated_requests": 1234, "sweep": {"seed": 2024},
            "base": {"workload.duration_s": 50.0, "fleet.max_num_seqs": 256} if "old" in name
            else {"workload.duration_s": 50.0},
            "goodput": {"attainment_pct": 90.0}}  # fmt: skip
    (folder / "sweep.json").write_text(json.dumps(meta), "utf-8")


@pytest.fixture
def sweeps(tmp_path: Path) -> tuple[Path, Path]:
    old, new = tmp_path / "old", tmp_path / "new"
    _write_sweep(old, "capacity-old-model",
                 {(4, "1:1"): (8.0, ""), (4, "3:1"): (10.0, ""), (8, "1:1"): (20.0, ""),
                  (8, "3:1"): (0.0, "below")}, attainment_drop=20.0)  # fmt: skip
    _write_sweep(new, "capacity",
                 {(4, "1:1"): (6.0, ""), (4, "3:1"): (0.0, "below"), (8, "1:1"): (15.0, ""),
                  (8, "3:1"): (12.0, "")}, attainment_drop=30.0)  # fmt: skip
    return old, new


def test_writes_the_png_and_the_paired_csv(sweeps: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sweeps
    out = tmp_path / "cmp"
    assert main([str(old), str(new), "--out", str(out)]) == 0
    png = (out / "capacity-compare.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    with (out / "capacity-compare.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8  # every (size, ratio, rate) once
    by_point = {(r["fleet_size"], r["pd_ratio"], r["rate_multiplier"]): r for r in rows}
    first = by_point[("4", "1:1", "0.5")]
    assert (first["old_goodput_rps"], first["new_goodput_rps"]) == ("8.0", "6.0")
    assert first["goodput_change_pct"] == "-25.0"
    assert (first["old_slo_attainment_pct"], first["new_slo_attainment_pct"]) == ("90.0", "85.0")
    assert by_point[("4", "3:1", "0.5")]["goodput_change_pct"] == "nan"  # new one below
    below = by_point[("8", "3:1", "1.0")]
    assert (below["old_goodput_bound"], below["new_goodput_bound"]) == ("below", "")
    assert below["goodput_change_pct"] == "nan"  # no change against a goodput under the rates
    assert by_point[("8", "1:1", "1.0")]["goodput_change_pct"] == "-25.0"


def test_refuses_sweeps_over_different_points(
    sweeps: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = sweeps
    lines = (new / "capacity.csv").read_text("utf-8").splitlines()
    (new / "capacity.csv").write_text("\n".join(lines[:-1]) + "\n", "utf-8")  # one rate less
    assert main([str(old), str(new), "--out", str(tmp_path / "cmp")]) == 2
    assert "only in old [(8, '3:1', 1.0)]" in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()
    assert main([str(old), str(tmp_path / "nowhere"), "--out", str(tmp_path / "cmp")]) == 2
    assert "not a finished capacity sweep" in capsys.readouterr().err


def test_old_model_recipe_is_the_capacity_sweep_with_old_engine_settings() -> None:
    new = build_plan(load_spec(EXPERIMENTS / "capacity.toml"))
    old = build_plan(load_spec(EXPERIMENTS / "capacity-old-model.toml"))
    assert [t.seed for t in old.tasks] == [t.seed for t in new.tasks]
    for mine, theirs in zip(old.tasks, new.tasks, strict=True):
        pinned = copy.deepcopy(theirs.scenario)
        pinned["fleet"].update(OLD_PINS)
        assert mine.scenario == pinned
    engine = parse_scenario(old.tasks[0].scenario).fleet
    params = engine.engine_params()
    assert (params.max_num_seqs, params.max_num_batched_tokens) == (256, 2048)
    assert engine.step_timing() is step_model("llama3-70b-tp4")  # no all-reduce
    assert isinstance(parse_scenario(new.tasks[0].scenario).fleet.step_timing(), TensorParallelStep)
