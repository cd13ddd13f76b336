"""Sweeps write the promised files, and give identical results in this process, over local
processes and over Ray."""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.experiments.aggregate import SweepResult
from narwhal.experiments.spec import load_spec
from narwhal.experiments.sweep import run_sweep, write_sweep
from narwhal.experiments.worker import CLASS_FIELDS, CLASS_PREFIX, METRIC_FIELDS
from tests.experiments.conftest import EXPERIMENTS

RECIPE_FILES = {
    "tuning": ["tuning"],
    "retries": ["retries_cdf", "retries_errors"],
    "capacity": ["capacity"],
    "diffuse": ["diffuse"],
    "routing": ["routing"],
    "routing-shared": ["routing"],
    "flow": ["flow"],
}
FIGURE_COLUMNS = {
    "tuning": {"recovery.eject_after", "recovery.failure_quarantine_s", "success_pct",
               "first_byte_p99_s", "goodput_rps", "recommended", "baseline",
               "goodput_rps_vs_baseline", "goodput_rps_vs_baseline_low",
               "goodput_rps_vs_baseline_high", "success_pct_ci_low", "success_pct_ci_high"},
    "retries_cdf": {"setting", "fraction_of_requests", "first_byte_s"},
    "retries_errors": {"setting", "error_class", "requests_pct"},
    "capacity": {"fleet_size", "pd_ratio", "prefill", "decode", "offered_rps",
                 "slo_attainment_pct", "goodput_rps", "goodput_per_engine",
                 "goodput_rps_ci_low", "goodput_rps_ci_high"},
    "diffuse": {"case", "recovery.max_ejection_percent", "recovery.failure_quarantine_s",
                "success_pct", "goodput_rps", "no_engine_503s", "recommended", "default",
                "success_pct_ci_half", "goodput_rps_ci_half"},
    "routing": {"policy", "rate_multiplier", "offered_rps", "first_byte_p50_s",
                "first_byte_p90_s", "tpot_p50_s", "slo_attainment_pct", "rejected_pct",
                "prefix_cache_hit_rate", "goodput_rps", "goodput_bound", "default",
                "recommended", "goodput_rps_ci_low", "goodput_rps_ci_high"},
    "flow": {"case", "load", "class", "slo_attainment_pct", "slo_attainment_pct_ci_low",
             "slo_attainment_pct_ci_high", "first_byte_p90_s", "first_byte_p90_s_ci_low",
             "first_byte_p90_s_ci_high", "on_time_rps", "on_time_rps_ci_low",
             "on_time_rps_ci_high", "shed", "success_pct"},
}  # fmt: skip


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def quick_args(name: str, out: Path) -> list[str]:
    return ["sweep", str(EXPERIMENTS / f"{name}.toml"), "--quick", "--workers", "0",
            "--no-progress", "--out", str(out)]  # fmt: skip


@pytest.fixture(scope="module")
def quick_sweeps(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The output folder of each recipe's quick sweep, run once for the module (read-only: a
    test that changes files works on a copy)."""
    done: dict[str, Path] = {}

    def quick(name: str) -> Path:
        if name not in done:
            out = tmp_path_factory.mktemp("quick") / name
            assert main(quick_args(name, out)) == 0
            done[name] = out
        return done[name]

    return quick


@pytest.mark.parametrize("name", sorted(RECIPE_FILES))
def test_quick_recipe_writes_csv_and_png(name: str, quick_sweeps: Callable[[str], Path]) -> None:
    out = quick_sweeps(name)
    runs, points = _read(out / "runs.csv"), _read(out / "points.csv")
    meta = json.loads((out / "sweep.json").read_text("utf-8"))
    assert meta["quick"] is True and meta["runs"] == len(runs)
    spec = load_spec(EXPERIMENTS / f"{name}.toml").quick_version()
    axes = [*spec.grid, *(["case"] if spec.cases else [])]
    expected = {"point", "replicate", "seed", *axes, "prefill", "decode", *METRIC_FIELDS}
    assert expected <= set(runs[0])
    assert {"point", *axes, "replicates", "success_pct", "first_byte_p99_s"} <= set(points[0])
    assert len(points) == len(spec.cases or [None]) * math.prod(len(v) for v in spec.grid.values())
    if spec.goodput is not None:
        assert {"rate_multiplier"} <= set(runs[0])
        assert {"goodput_rps", "goodput_per_engine", "goodput_bound"} <= set(points[0])
    assert all(float(r["requests"]) > 0 for r in runs)
    for stem in RECIPE_FILES[name]:
        png = out / f"{stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        rows = _read(out / f"{stem}.csv")
        assert rows and FIGURE_COLUMNS[stem] <= set(rows[0])
    advice = json.loads((out / "recommendation.json").read_text("utf-8"))
    assert {"recommended", "baseline", "confidence", "replicates", "reason"} <= set(advice)
    assert advice["replicates"] == spec.sweep.replicates
    if name == "tuning":  # the boxed cell is recommendation.json's, the baseline is marked
        cells = _read(out / "tuning.csv")
        boxed = [c for c in cells if c["recommended"] == "True"]
        assert len(boxed) == (0 if advice["recommended"] is None else 1)
        assert advice["baseline"] == {
            "recovery.eject_after": 3, "recovery.failure_quarantine_s": 0.0
        }  # fmt: skip
        assert [c["baseline"] for c in cells].count("True") == 1
    picked = advice["recommended"] is not None
    if name == "diffuse":  # recommendation.json's setting and the default: a row per case each
        rows = _read(out / "diffuse.csv")
        assert sum(r["recommended"] == "True" for r in rows) == len(spec.cases) * picked
        default = [r for r in rows if r["default"] == "True"]
        assert len(default) == len(spec.cases)
        assert {r["recovery.max_ejection_percent"] for r in default} == {"50"}
    if name.startswith("routing"):  # one policy recommended, one the default: a row per rate
        rows = _read(out / "routing.csv")
        rates = len(spec.goodput.rate_multipliers) if spec.goodput else 0
        assert len(rows) == len(spec.cases) * rates
        assert sum(r["recommended"] == "True" for r in rows) == rates * picked
        assert {r["policy"] for r in rows if r["default"] == "True"} == {"least_reserved"}
        assert advice["baseline"] == {"case": "least_reserved"}
        assert all(0.0 <= float(r["prefix_cache_hit_rate"]) <= 1.0 for r in rows)
        hits = {r["policy"]: float(r["prefix_cache_hit_rate"]) for r in rows}
        assert hits["prefix_affinity"] > 0.0  # the workload shares prefixes and caching is on
    classes = [k for k in runs[0] if k.startswith(CLASS_PREFIX)]
    if name != "flow":  # no workload classes: no class columns, the rows as they always were
        assert classes == [] and not any(k.startswith(CLASS_PREFIX) for k in points[0])
    else:  # per class, every metric, in the scenario's order; means with intervals per point
        names = ["critical", "noisy", "sheddable"]
        assert classes == [f"{CLASS_PREFIX}{n}.{k}" for n in names for k in CLASS_FIELDS]
        for run in runs:  # the classes partition the run's requests
            assert sum(int(run[f"{CLASS_PREFIX}{n}.requests"]) for n in names) == int(
                run["requests"]
            )
        for key in classes:
            assert {key, f"{key}_ci_low", f"{key}_ci_high"} <= set(points[0])
        rows = _read(out / "flow.csv")
        assert len(rows) == len(points) * len(names)
        plain = {(r["load"], r["class"]): r for r in rows if r["case"] == "plain admission"}
        assert {r["case"] for r in rows} == {"plain admission", "flow control"}
        assert all(plain[(r["load"], r["class"])]["shed"] in ("0", "0.0") for r in rows)


def _files(result: SweepResult, out: Path) -> dict[str, bytes]:
    write_sweep(result, out)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_processes_give_the_same_results_as_in_process(tiny_spec: Path, tmp_path: Path) -> None:
    spec = load_spec(tiny_spec)
    here = run_sweep(spec, workers=0)
    pool = run_sweep(spec, workers=2)
    assert [o.metrics for o in here.outcomes] == [o.metrics for o in pool.outcomes]
    assert here.runs == pool.runs and here.points == pool.points
    assert len({r["seed"] for r in here.runs}) == 2  # seeds by replicate (the default)
    assert _files(here, tmp_path / "a") == _files(pool, tmp_path / "b")  # PNG bytes too
    other = run_sweep(spec, workers=0, seed=8)
    assert other.runs != here.runs


@pytest.mark.slow  # starting a local Ray takes 10-30 s
def test_ray_gives_the_same_results_as_local_processes(tiny_spec: Path) -> None:
    pytest.importorskip(
        "ray", reason="ray is not installed (optional extra: pip install -e '.[ray]')"
    )
    spec = load_spec(tiny_spec)
    local = run_sweep(spec, workers=2)
    on_ray = run_sweep(spec, ray_address="local", workers=2)
    assert [o.metrics for o in on_ray.outcomes] == [o.metrics for o in local.outcomes]
    assert on_ray.runs == local.runs and on_ray.points == local.points


def test_cli_check_prints_the_plan(tiny_spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(tiny_spec), "--check"]) == 0
    captured = capsys.readouterr()
    assert "4 points x 2 replicates = 16 runs (seed 7)" in captured.err
    assert "point 3: eject_after=3, failure_quarantine_s=2.0" in captured.out


def test_ray_missing_is_a_clear_error(
    tiny_spec: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    code = main(["sweep", str(tiny_spec), "--ray", "local", "--no-progress",
                 "--out", str(tiny_spec.parent / "out")])  # fmt: skip
    assert code == 1
    assert "pip install 'narwhal-router[ray]'" in capsys.readouterr().err


def test_redraw_rebuilds_the_same_files_from_runs_csv(
    tmp_path: Path, quick_sweeps: Callable[[str], Path]
) -> None:
    out = shutil.copytree(quick_sweeps("tuning"), tmp_path / "tuning")
    args = quick_args("tuning", out)
    before = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    (out / "tuning.png").unlink()
    assert main([*args, "--redraw"]) == 0
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == before
    assert main([*args, "--redraw", "--seed", "1"]) == 2  # other seeds: not this sweep's CSV


def test_redraw_rebuilds_the_flow_recipe_with_its_class_columns(
    tmp_path: Path, quick_sweeps: Callable[[str], Path]
) -> None:
    out = shutil.copytree(quick_sweeps("flow"), tmp_path / "flow")
    before = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    (out / "flow.png").unlink()
    (out / "points.csv").unlink()
    assert main([*quick_args("flow", out), "--redraw"]) == 0
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == before


def test_redraw_refuses_another_grids_runs_even_with_the_same_seeds(
    tmp_path: Path, quick_sweeps: Callable[[str], Path]
) -> None:
    out = shutil.copytree(quick_sweeps("tuning"), tmp_path / "tuning")
    args = quick_args("tuning", out)
    runs = out / "runs.csv"
    rows = list(csv.DictReader(runs.read_text("utf-8").splitlines()))
    column = next(key for key in rows[0] if "eject_after" in key)
    for row in rows:  # what a run of the same seeds over other eject_after values would hold
        row[column] = str(int(row[column]) + 10)
    with runs.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    assert main([*args, "--redraw"]) == 2


def test_an_out_path_that_is_a_file_is_refused_before_running(
    tiny_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tiny_spec.parent / "taken"
    taken.write_text("not a directory")
    assert main(["sweep", str(tiny_spec), "--workers", "0", "--out", str(taken)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_a_failing_run_in_process_is_reported_like_in_a_pool(
    tiny_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tiny_spec.read_text("utf-8")
    broken = tiny_spec.parent / "broken.toml"  # runs, but its scenario fails inside the run
    base = '\n[base]\n"workload.duration_s" = 1e-9\n"faults.0.at_s" = 0.0\n'  # no request
    broken.write_text(text + base, "utf-8")
    code = main(["sweep", str(broken), "--workers", "0", "--no-progress",
                 "--out", str(tiny_spec.parent / "o")])  # fmt: skip
    assert code == 1
    assert "run 0 failed" in capsys.readouterr().err
