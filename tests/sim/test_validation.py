"""Replaying real vLLM runs on the simulated engine, and the accuracy it reaches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.sim.profiles import store
from narwhal.sim.profiles.source import ProfileError
from narwhal.sim.scenario import FleetSettings, ScenarioError, parse_scenario
from narwhal.sim.validation.replay import engine_timing, replay
from narwhal.sim.validation.runlog import prompt_segments, read_run
from narwhal.sim.validation.validate import validate

RUNS = Path(__file__).parent.parent / "data" / "runs"
PRO6000 = RUNS / "RTXPRO6000" / "Llama-3.1-8B"
RTX4090 = RUNS / "RTX4090" / "Llama-3.1-8B"
QWEN_TP2 = RUNS / "RTXPRO6000" / "Qwen3-32B"
KEYS = {"real", "sim", "error_pct", "ks_d", "ks_p", "tost_p"}


def small_run(tmp_path: Path, rows: list[tuple[float, int, int]]) -> Path:
    """A run directory with PRO6000's meta.json and the given (queued_ts, input, output)."""
    run = tmp_path / "RTXPRO6000" / "model" / "vllm"
    run.mkdir(parents=True)
    shutil.copy(PRO6000 / "vllm" / "meta.json", run / "meta.json")
    with (run / "requests.jsonl").open("w") as handle:
        for i, (t, prompt, output) in enumerate(rows):
            handle.write(
                json.dumps(
                    {
                        "request_id": f"bench-{i}",
                        "input_toks": prompt,
                        "output_toks": output,
                        "queued_ts": t,
                        "first_token_ts": t + 0.1,
                        "last_token_ts": t + 0.1 + output,
                    }
                )
                + "\n"
            )
    return run.parent


def test_a_lone_request_takes_the_profiles_prefill_then_one_decode_step_per_token(tmp_path):
    run = read_run(small_run(tmp_path, [(100.0, 300, 4)]))
    profile = store.bundled("RTXPRO6000", "meta-llama/Llama-3.1-8B")
    _, timing = engine_timing(run, profile)
    (timed,) = replay(run, profile)
    prefill = timing.batch_s(0, 300, 0, 300 * 150, 1)
    decodes = [timing.batch_s(1, 0, 301 + k, 0.0) for k in range(3)]  # prompt + tokens so far
    assert timed.ttft_s == pytest.approx(prefill)
    assert timed.latency_s == pytest.approx(prefill + sum(decodes))


def test_replay_is_deterministic_and_batches_concurrent_requests(tmp_path):
    rows = [(10.0 + 0.01 * i, 500, 50) for i in range(20)]
    run = read_run(small_run(tmp_path, rows))
    profile = store.bundled("RTXPRO6000", "meta-llama/Llama-3.1-8B")
    first, second = replay(run, profile), replay(run, profile)
    assert first == second
    _, timing = engine_timing(run, profile)
    alone = timing.batch_s(1, 0, 550, 0.0)
    # twenty decodes share a step: each token takes longer than alone, far less than 20x
    tpots = [t.tpot_s for t in first if t.tpot_s is not None]
    assert all(alone < tpot < 5 * alone for tpot in tpots)


def test_prompt_segments_share_exactly_the_common_full_blocks():
    a = list(range(40))
    b = list(range(32)) + [99] * 8
    seg_a, seg_b = prompt_segments([a, b], 16)
    assert seg_a[:2] == seg_b[:2]  # two shared full blocks
    assert seg_a[2] != seg_b[2] and sum(n for _, n in seg_b) == 40


def test_validate_writes_the_documented_keys_a_plot_and_its_csv(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["validate", "--run", str(RTX4090), "--out", str(out)]) == 0
    result = json.loads((out / "validation.json").read_text())
    assert set(result) == {"ttft_ms", "tpot_ms", "latency_ms"}
    for entry in result.values():
        assert set(entry) == KEYS
        assert set(entry["real"]) == set(entry["sim"]) == {"mean", "p50", "p90", "p99"}
    assert (out / "cdf.png").stat().st_size > 10_000
    rows = (out / "cdf.csv").read_text().splitlines()
    assert rows[0] == "metric,side,value_ms,fraction" and len(rows) > 1000
    out = capsys.readouterr().out
    assert "TTFT mean" in out and "dataset" not in out  # found beside the run: no note


def test_a_run_whose_dataset_is_missing_says_its_prompts_are_replayed_as_unique(tmp_path, capsys):
    run = small_run(tmp_path, [(1.0, 40, 3), (1.5, 40, 3)])  # meta.json names its dataset
    assert read_run(run).dataset is None
    assert main(["validate", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    name = json.loads((PRO6000 / "vllm" / "meta.json").read_text())["dataset_path"]
    assert f"note: the run's dataset {name} was not found" in out
    assert str(run / "dataset.jsonl.xz") in out and "replayed as unique content" in out
    found = read_run(PRO6000)  # the same meta.json, its dataset beside it
    assert found.dataset == PRO6000 / "dataset.jsonl.xz" and found.dataset_missing is None


def test_a_run_or_profile_it_cannot_use_gets_a_clear_error(tmp_path, capsys):
    assert main(["validate", "--run", str(tmp_path)]) == 2
    assert "no requests.jsonl" in capsys.readouterr().err
    run = small_run(tmp_path, [(1.0, 10, 2)])
    meta = json.loads((run / "vllm" / "meta.json").read_text())
    del meta["engine_kwargs"]["max_num_seqs"]
    (run / "vllm" / "meta.json").write_text(json.dumps(meta))
    engine = read_run(run).engine  # not recorded: vLLM's default on the run's GPU, said so
    assert engine.max_num_seqs == 1024 and "max_num_seqs" in engine.defaulted
    elsewhere = tmp_path / "B200" / "model"
    shutil.copytree(run, elsewhere)
    assert main(["validate", "--run", str(elsewhere)]) == 2
    assert "engine_kwargs has no max_num_seqs, GPU 'B200' is not one of" in (
        capsys.readouterr().err
    )
    meta["hardware"] = {"device_name": "NVIDIA B200", "device_total_memory_bytes": 190 * 2**30}
    (elsewhere / "vllm" / "meta.json").write_text(json.dumps(meta))
    engine = read_run(elsewhere).engine  # vLLM's default for the device the run recorded
    assert engine.max_num_seqs == 1024 and "max_num_seqs" in engine.defaulted
    shutil.copy(PRO6000 / "vllm" / "meta.json", run / "vllm" / "meta.json")
    (run / "vllm" / "requests.jsonl").write_text('{"input_toks": 3}\n')
    with pytest.raises(ProfileError, match="no output_toks, queued_ts"):
        read_run(run)


@pytest.mark.parametrize(
    "run_dir", [RTX4090, PRO6000, QWEN_TP2], ids=["RTX4090", "RTXPRO6000", "RTXPRO6000-Qwen3-32B"]
)
def test_the_runs_stay_within_the_accuracy_goal(run_dir: Path) -> None:
    """Accuracy regression (deterministic replay): means within 5%, p90/p99 within 10%, and KS
    rejecting none of TTFT, TPOT or end-to-end latency. Figures: docs/simulator.md, Fidelity."""
    result = validate(run_dir).result
    for metric in ("ttft_ms", "tpot_ms", "latency_ms"):
        errors = result[metric]["error_pct"]
        assert abs(errors["mean"]) < 5, (metric, errors)
        assert abs(errors["p90"]) < 10 and abs(errors["p99"]) < 10, (metric, errors)
        assert result[metric]["ks_p"] > 0.05, (metric, result[metric])


H100 = RUNS / "H100"
# the H100 runs' errors as measured (docs/simulator.md, Fidelity): mean TTFT, mean TPOT, in %
H100_ERRORS = {"Llama-3.1-70B-SD": (1.5, 10.7), "Llama-3.1-70B-PDD": (-17.1, -10.4)}


@pytest.mark.parametrize("name", sorted(H100_ERRORS))
def test_the_h100_runs_published_as_means_stay_within_their_measured_error(name: str) -> None:
    """Accuracy regression (deterministic replay) on LLMServingSim's ISPASS'26 H100 runs, one
    engine and one prefill + one decode engine through the router: no worse than measured."""
    done = validate(H100 / name)
    assert done.run.means is not None and not done.samples
    for metric, measured in zip(("ttft_ms", "tpot_ms"), H100_ERRORS[name], strict=True):
        error = done.result[metric]["error_pct"]["mean"]
        assert abs(error) <= abs(measured) + 1.0, (metric, error, measured)
    assert "LLMServingSim 2.0" in done.result["anchors"]


A6000 = RUNS / "A6000"
A6000_RUNS = ("Llama-3.1-8B-SD+PC", "Llama-3.1-8B-MD", "Llama-3.1-8B-PDD")


@pytest.mark.parametrize("name", A6000_RUNS)
def test_the_a6000_runs_published_as_throughput_stay_within_the_goal(name: str) -> None:
    """Accuracy regression (deterministic replay) on LLMServingSim's ISPASS'26 RTX A6000 runs (one
    engine, two, one prefill + one decode): output throughput within 5% of the real series'
    estimate, and the bracket the series allows carried through. Figures: docs/simulator.md."""
    done = validate(A6000 / name)
    assert done.run.gpu == "A6000" and done.run.engine.tensor_parallel == 1
    entry = done.result["throughput_tok_s"]
    assert abs(entry["error_pct"]["mean"]) < 5, entry
    real, sim, error = entry["real"], entry["sim"]["mean"], entry["error_pct"]
    assert real["low"] < real["mean"] < real["high"]
    assert error["low"] == pytest.approx(100 * (sim / real["low"] - 1))
    assert error["high"] == pytest.approx(100 * (sim / real["high"] - 1))
    assert set(done.unpublished) == {"ttft_ms", "tpot_ms", "latency_ms"}
    assert "LLMServingSim 2.0" in done.result["anchors"]


def test_a_bracket_of_a_real_figure_is_checked_against_it(tmp_path, capsys):
    run = tmp_path / "A6000" / "run"
    shutil.copytree(A6000 / "Llama-3.1-8B-MD", run, symlinks=False)
    assert main(["validate", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "output tok/s: real bracketed 1698.5 .. 1733.9" in printed
    assert "simulated, not published: TTFT mean (ms)" in printed
    written = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert set(written) == {"throughput_tok_s", "anchors"}
    assert set(written["throughput_tok_s"]["real"]) == {"mean", "low", "high"}
    means_path = run / "vllm" / "means.json"
    means = json.loads(means_path.read_text())
    for bad, message in (
        ({"throughput_tok_s": [1800.0, 1900.0]}, r"not \[low, high\] of positive numbers around"),
        ({"throughput_tok_s": [1700.0]}, r"not \[low, high\]"),
        ({"ttft_ms": [1.0, 2.0]}, "real_range: ttft_ms is not one of real's figures"),
    ):
        means_path.write_text(json.dumps({**means, "real_range": bad}))
        with pytest.raises(ProfileError, match=message):
            read_run(run)
    means_path.write_text(json.dumps({**means, "real_bracket": {}}))
    with pytest.raises(ProfileError, match="unknown real_bracket"):
        read_run(run)


def test_a_means_only_run_needs_its_dataset_and_known_figures(tmp_path, capsys):
    run = tmp_path / "H100" / "run"
    shutil.copytree(H100 / "Llama-3.1-70B-SD", run, symlinks=False)
    assert main(["validate", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "published as means only" in printed and "LLMServingSim 2.0" in printed
    written = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert set(written) == {"ttft_ms", "tpot_ms", "throughput_tok_s", "anchors"}
    means = json.loads((run / "vllm" / "means.json").read_text())
    (run / "vllm" / "means.json").write_text(json.dumps({**means, "real": {"ttft_p99": 1.0}}))
    with pytest.raises(ProfileError, match="real: unknown ttft_p99"):
        read_run(run)
    (run / "vllm" / "means.json").write_text(json.dumps(means))
    (run / "dataset.jsonl.xz").unlink()
    with pytest.raises(ProfileError, match="a means-only run replays its dataset"):
        read_run(run)


def test_a_scenario_runs_on_a_bundled_gpu_profile_with_a_real_runs_workload():
    from narwhal.sim.runner import run

    scenario = parse_scenario(
        {
            "fleet": {
                "gpu": "RTXPRO6000",
                "model": "meta-llama/Llama-3.1-8B",
                "prefill": 1,
                "decode": 1,
            },
            "workload": {"kind": "run", "run": str(PRO6000)},
        }
    )
    assert scenario.fleet.kv_budget().num_blocks == pytest.approx(35_913, rel=0.01)
    result = run(scenario)
    assert len(result.records) == 300
    assert all(r.status == 200 for r in result.records)


def test_engines_run_past_their_profile_say_so():
    fleet = {"gpu": "RTXPRO6000", "model": "meta-llama/Llama-3.1-8B", "both": 1}
    notes = FleetSettings(**fleet).vllm_notes()  # vLLM's 1024 / 8192 on this GPU
    assert any("8192 is past the RTXPRO6000 profile's largest measured step" in n for n in notes)
    within = {**fleet, "max_num_seqs": 128, "max_num_batched_tokens": 2048}
    assert FleetSettings(**within).vllm_notes() == [
        "max_num_seqs 128 departs from vLLM's default 1024 on NVIDIA RTX PRO 6000 Blackwell "
        "Server Edition",
        "max_num_batched_tokens 2048 departs from vLLM's default 8192 on NVIDIA RTX PRO 6000 "
        "Blackwell Server Edition",
    ]


def test_unknown_gpu_or_model_lists_what_exists():
    with pytest.raises(ScenarioError, match="known: A6000, H100, H200, RTX4090, RTXPRO6000"):
        parse_scenario({"fleet": {"gpu": "B200", "prefill": 1, "decode": 1}})
    with pytest.raises(
        ScenarioError,
        match=r"bundled: A6000 meta-llama/Llama-3\.1-8B, H100 meta-llama/Llama-3\.1-70B, RTX4090",
    ):
        parse_scenario({"fleet": {"gpu": "RTX4090", "model": "x/y", "both": 1}})


def _disaggregated(run: Path, link_gbps: float) -> Path:
    config = json.loads((PRO6000 / "config.json").read_text())
    config["link_bw"], config["link_latency"] = link_gbps, 0
    instance = config["nodes"][0]["instances"][0]
    roles = [dict(instance, pd_type="prefill"), dict(instance, pd_type="decode")]
    config["nodes"][0]["instances"] = roles
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_a_disaggregated_run_goes_through_the_router_and_pays_its_kv_pull(tmp_path):
    """One prefill + one decode engine: the KV of the prompt crosses the run's link, so a
    link 100x slower adds the prompt's KV bytes over it to the first token."""
    profile = store.bundled("RTXPRO6000", "meta-llama/Llama-3.1-8B")
    ttft = {}
    for gbps in (1, 100):
        run_dir = _disaggregated(small_run(tmp_path / str(gbps), [(5.0, 300, 8)]), gbps)
        run = read_run(run_dir)
        assert run.cluster.prefill == run.cluster.decode == 1
        (timed,) = replay(run, profile)
        ttft[gbps] = timed.ttft_s
    kv_bytes = 300 * 131_072  # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x bf16
    assert ttft[1] - ttft[100] == pytest.approx(kv_bytes / 1e9 - kv_bytes / 100e9, rel=0.05)


def test_the_h100_is_selectable_with_vllms_defaults_for_its_class():
    fleet = FleetSettings(
        gpu="H100", model="meta-llama/Llama-3.1-70B", tensor_parallel=4, prefill=1, decode=1
    )
    batch = fleet.batch()  # vLLM's H100/H200 tier (>= 70 GiB, not an A100), vllm serve
    assert (batch.max_num_seqs, batch.max_num_batched_tokens) == (1024, 8192)
    budget = fleet.kv_budget()  # one rank of 4: 80 layers x 2 KV heads x 128 x 2 x bf16 a token
    assert budget.bytes_per_block == 16 * 80 * 2 * 128 * 2 * 2
    assert 0 < budget.num_blocks * 16 < 80e9 / (80 * 2 * 128 * 2 * 2)


def test_the_a6000_is_selectable_with_vllms_defaults_for_its_class():
    fleet = FleetSettings(gpu="A6000", model="meta-llama/Llama-3.1-8B", both=1)
    batch = fleet.batch()  # 47.54 GiB: under vLLM's 70 GiB tier, vllm serve
    assert (batch.max_num_seqs, batch.max_num_batched_tokens) == (256, 2048)
    budget = fleet.kv_budget()  # 32 layers x 8 KV heads x 128 x 2 (K, V) x bf16 a token
    assert budget.bytes_per_block == 16 * 32 * 8 * 128 * 2 * 2
    assert 0 < budget.num_blocks * budget.bytes_per_block < 0.92 * 47.54 * 2**30 - 16e9


def test_a_run_recording_its_capture_sizes_is_replayed_with_them(tmp_path):
    run = read_run(RTX4090)
    assert run.engine.capture_sizes is not None and run.engine.capture_sizes[-1] == 512
    _, timing = engine_timing(run, store.bundled("RTX4090", "meta-llama/Llama-3.1-8B"))
    assert timing.graph_sizes == run.engine.capture_sizes  # type: ignore[attr-defined]
    meta = json.loads((RTX4090 / "vllm" / "meta.json").read_text())
    meta["resolved_config"]["compilation_config"]["cudagraph_capture_sizes"] = [1, 2, 4, 64]
    copy = tmp_path / "RTX4090" / "Llama-3.1-8B"
    shutil.copytree(RTX4090, copy)
    (copy / "vllm" / "meta.json").write_text(json.dumps(meta))
    _, timing = engine_timing(read_run(copy), store.bundled("RTX4090", "meta-llama/Llama-3.1-8B"))
    assert timing.padded(5) == 64 and timing.padded(65) == 65  # type: ignore[attr-defined]


def test_cudagraph_capture_sizes_is_a_fleet_setting_of_profiled_gpus_only():
    fleet = {"gpu": "RTXPRO6000", "model": "meta-llama/Llama-3.1-8B", "both": 1}
    sizes = FleetSettings(**fleet, cudagraph_capture_sizes=(8, 1, 32)).step_timing()
    assert sizes.graph_sizes == (1, 8, 32)  # type: ignore[attr-defined]
    with pytest.raises(ScenarioError, match="cudagraph_capture_sizes are for per-operator"):
        parse_scenario({"fleet": {"both": 1, "cudagraph_capture_sizes": [1, 2]}})
    with pytest.raises(ScenarioError, match="batch sizes of at least 1"):
        parse_scenario({"fleet": {**fleet, "cudagraph_capture_sizes": [0, 2]}})


def test_a_gpu_outside_the_catalogue_runs_on_what_its_run_records(tmp_path, capsys):
    # the TP 2 Qwen3-32B run and its profile, on a GPU Narwhal has no entry for
    run = tmp_path / "L40S" / "Qwen3-32B"
    shutil.copytree(QWEN_TP2, run, symlinks=False)
    config = (run / "config.json").read_text()
    (run / "config.json").write_text(config.replace("RTXPRO6000", "L40S"))
    profile = tmp_path / "qwen.json.gz"
    store.write({**store.bundled("RTXPRO6000", "Qwen/Qwen3-32B"), "gpu": "L40S"}, profile)
    command = ["validate", "--run", str(run), "--profile", str(profile)]
    assert main(command) == 2  # meta.json records no device: vLLM's KV sizing has no input
    assert "does not record its device_name and device_total_memory_bytes" in (
        capsys.readouterr().err
    )
    meta = json.loads((run / "vllm" / "meta.json").read_text())
    meta["hardware"] = {"device_name": "L40S", "device_total_memory_bytes": round(95.5 * 2**30)}
    (run / "vllm" / "meta.json").write_text(json.dumps(meta))
    # the run's own link (16 GB/s, 20 us a link) gives the all-reduce: the catalogue's entry
    # for the RTX PRO 6000 holds the same figures, so the replay is the same to the bit
    assert main([*command, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "its TP all-reduce is the run's link, 16 GB/s bus bandwidth and 40 us" in out
    assert main(["validate", "--run", str(QWEN_TP2), "--out", str(tmp_path / "known")]) == 0
    known = (tmp_path / "known" / "validation.json").read_text()
    assert (tmp_path / "out" / "validation.json").read_text() == known
    cluster = json.loads(config)
    del cluster["link_bw"]
    (run / "config.json").write_text(json.dumps(cluster).replace("RTXPRO6000", "L40S"))
    assert main(command) == 2
    assert "its TP 2 all-reduce needs the run's link: link_bw" in capsys.readouterr().err


def test_a_scenario_takes_a_profile_already_read_instead_of_a_file():
    profile = store.bundled("RTX4090", "meta-llama/Llama-3.1-8B")
    doctored = {**profile, "gpu": "RTXPRO6000"}  # the 4090's tables, said to be the PRO 6000's
    fleet = {"gpu": "RTXPRO6000", "model": "meta-llama/Llama-3.1-8B", "both": 1}
    workload = {"kind": "fixed", "arrivals_s": [0.0], "prompt_tokens": 20}
    given = parse_scenario({"fleet": fleet, "workload": workload}, profile=doctored).fleet
    own = parse_scenario({"fleet": fleet, "workload": workload}).fleet
    assert given.op_profile() is doctored
    timing = given.step_timing()
    expected = store.timing(profile, 1, timing.graph_sizes)  # type: ignore[attr-defined]
    assert timing.batch_s(8, 0, 8000, 0.0) == expected.batch_s(8, 0, 8000, 0.0)
    assert own.step_timing().batch_s(8, 0, 8000, 0.0) != timing.batch_s(8, 0, 8000, 0.0)
    with pytest.raises(ScenarioError, match=r"profile \(given\) is of"):
        parse_scenario({"fleet": fleet, "workload": workload}, profile=profile)
