"""Per-operator profiles: LLMServingSim's layout imported, interpolated and turned into steps."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.sim.profiles import importer, source, store
from narwhal.sim.profiles.opstep import capture_sizes
from narwhal.sim.profiles.tables import AttentionGrid, Curve

RUNS = Path(__file__).parent.parent / "data" / "runs"
CONFIG = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
SIZES = (1, 2, 4, 8, 16, 32)


def _op_us(name: str, tokens: int) -> float:
    """A linear time per operator, so interpolation between grid points is exact."""
    return {"qkv_proj": 10 + tokens, "layernorm": 2 + 0.5 * tokens}.get(name, 1 + 0.1 * tokens)


def _attn_us(chunk: int, cached: int, decodes: int, ctx: int) -> float:
    return 5 + 0.01 * chunk * (cached + chunk) + 0.002 * decodes * ctx


def write_profile(root: Path, moe: bool = False) -> Path:
    """An LLMServingSim-shaped profile directory with known, linear tables."""
    profile = root / "profiler" / "perf" / "TOYGPU" / "org" / "toy" / "bf16"
    tp1 = profile / "tp1"
    tp1.mkdir(parents=True)
    (profile / "meta.yaml").write_text(
        "model: org/toy\nhardware: TOYGPU\ngpu: Toy GPU\nvllm_version: 0.19.0\n"
        "tp_degrees: [1]\nengine_effective:\n  enforce_eager: true\n"
    )
    ops = ("embedding", "layernorm", "qkv_proj", "o_proj", "final_layernorm")
    dense = ["layer,tokens,time_us"] + [f"{op},{t},{_op_us(op, t)}" for op in ops for t in SIZES]
    (tp1 / "dense.csv").write_text("\n".join(dense) + "\n")
    per_seq = ["layer,sequences,time_us"] + [
        f"{op},{n},{us}" for op, us in (("lm_head", 50), ("sampler", 3)) for n in SIZES
    ]
    (tp1 / "per_sequence.csv").write_text("\n".join(per_seq) + "\n")
    attn = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for chunk in (0, 16, 32):
        for cached in (0, 16, 32) if chunk else (0,):
            for decodes in (0, 1, 4):
                for ctx in (16, 32, 64) if decodes else (0,):
                    if chunk or decodes:
                        us = _attn_us(chunk, cached, decodes, ctx)
                        attn.append(f"{chunk},{cached},{decodes},{ctx},{us}")
    (tp1 / "attention.csv").write_text("\n".join(attn) + "\n")
    if moe:
        (tp1 / "moe.csv").write_text("tokens,time_us\n1,1\n")
    config = root / "configs" / "model" / "org" / "toy.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(CONFIG))
    return profile


def test_import_writes_a_profile_that_times_a_step_from_its_tables(tmp_path, capsys):
    profile_dir = write_profile(tmp_path)
    out = tmp_path / "toy.json.gz"
    assert main(["profile", "import", str(profile_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "qkv_proj" in printed and "attention" in printed and "wrote" in printed
    profile = store.read(out)
    assert profile["config"]["layers"] == 2 and profile["config"]["kv_heads"] == 2
    assert profile["provenance"]["enforce_eager"] is True
    timing = store.timing(profile, 1, ())
    # 3 decodes (context 48 each) and one 16-token chunk after 16 cached tokens: 19 tokens
    tokens, pairs = 19, 16 * (16 + 16 / 2)
    got = timing.batch_s(3, 16, 3 * 48, pairs, 1)
    per_layer = _op_us("layernorm", tokens) * 2 + _op_us("qkv_proj", tokens)
    per_layer += _op_us("o_proj", tokens)
    once = _op_us("embedding", tokens) + _op_us("final_layernorm", tokens)
    # the attention grid is bilinear in (chunk, decodes) corners, exact at these grid points
    attn = _attn_us(16, 16, 3, 48)
    expected_us = 2 * per_layer + once + 2 * attn + 50 + 3
    assert got == pytest.approx(expected_us / 1e6, rel=0.02)


def test_same_input_gives_the_same_profile_bytes(tmp_path):
    profile_dir = write_profile(tmp_path)
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    for path in (a, b):
        store.write(store.from_source(importer.read_any(profile_dir), "x"), path)
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(gzip.decompress(a.read_bytes()))["format"] == store.FORMAT


def test_a_moe_profile_is_refused(tmp_path):
    with pytest.raises(source.ProfileError, match=r"moe\.csv"):
        importer.read_any(write_profile(tmp_path, moe=True))


@pytest.mark.parametrize(
    ("key", "layout"),
    [("num_local_experts", "v0"), ("num_experts", "perf"), ("n_routed_experts", "perf")],
)
def test_a_moe_model_config_is_refused_in_any_layout(tmp_path, capsys, key, layout):
    # the older layout's own tables have no moe.csv: only the model's config tells
    if layout == "v0":
        profile = tmp_path / "v0"
        shutil.copytree(V0, profile)
    else:
        profile = write_profile(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**CONFIG, key: 8, "num_experts_per_tok": 2}))
    out = tmp_path / "p.json.gz"
    command = ["profile", "import", str(profile), "--model-config", str(config)]
    assert main([*command, "--out", str(out)]) == 2
    assert f"a mixture-of-experts model ({key} 8)" in capsys.readouterr().err
    assert not out.exists()
    config.write_text(json.dumps({**CONFIG, key: 1}))  # one expert is a dense MLP
    assert main([*command, "--out", str(out)]) == 0


def test_missing_pieces_are_named(tmp_path, capsys):
    profile_dir = write_profile(tmp_path)
    (profile_dir / "tp1" / "attention.csv").unlink()
    assert main(["profile", "import", str(profile_dir), "--out", str(tmp_path / "x")]) == 2
    assert "attention.csv: missing" in capsys.readouterr().err
    with pytest.raises(source.ProfileError, match=r"meta\.yaml: missing"):
        source.read_profile(tmp_path)
    (tmp_path / "configs" / "model" / "org" / "toy.json").unlink()
    with pytest.raises(source.ProfileError, match=r"no model config for org/toy"):
        importer.read_any(profile_dir)


def test_curve_interpolates_extrapolates_and_clamps():
    curve = Curve([(1, 1.0), (3, 3.0), (5, 4.0)])
    assert curve.at(2) == pytest.approx(2.0)
    assert curve.at(7) == pytest.approx(5.0)  # the last segment's slope continues
    assert curve.at(0) == 1.0  # below the first size: the first time


def test_attention_grid_takes_the_nearest_slice_for_a_missing_corner():
    grid = AttentionGrid([(0, 0, 1, 16, 1.0), (0, 0, 1, 32, 2.0), (16, 0, 0, 0, 5.0)])
    assert grid.at(0, 0, 1, 24) == pytest.approx(1.5)
    # (16 tokens, 1 decode) was not measured: its nearest measured slice stands in
    assert grid.at(16, 0, 1, 24) == pytest.approx(5.0)


def test_capture_sizes_follow_vllms_rule_as_a_real_run_recorded_them():
    meta = json.loads((RUNS / "RTX4090" / "Llama-3.1-8B" / "vllm" / "meta.json").read_text())
    recorded = meta["resolved_config"]["compilation_config"]["cudagraph_capture_sizes"]
    assert list(capture_sizes(meta["engine_kwargs"]["max_num_seqs"])) == recorded


def test_bundled_profiles_carry_provenance_and_licence():
    catalog = store.bundled_catalog()
    assert ("RTXPRO6000", "meta-llama/Llama-3.1-8B") in catalog
    assert ("RTX4090", "meta-llama/Llama-3.1-8B") in catalog
    for gpu, model in catalog:
        profile = store.bundled(gpu, model)
        assert "LLMServingSim" in profile["provenance"]["licence"]
        # what measured it: a vLLM version, or the profiler named (LLMServingSim's older one)
        assert profile["provenance"]["vllm_version"] or profile["provenance"]["profiler"]
    with pytest.raises(
        source.ProfileError,
        match=r"bundled: A6000 meta-llama/Llama-3\.1-8B, H100 meta-llama/Llama-3\.1-70B, RTX4090",
    ):
        store.bundled("RTX4090", "org/unknown")


def test_a_scenario_runs_on_an_imported_profile_of_another_gpu(tmp_path):
    from narwhal.sim.runner import run
    from narwhal.sim.scenario import ScenarioError, parse_scenario

    out = tmp_path / "toy.json.gz"
    assert main(["profile", "import", str(write_profile(tmp_path)), "--out", str(out)]) == 0
    fleet = {"gpu": "TOYGPU", "model": "org/toy", "profile": str(out), "both": 2}
    with pytest.raises(ScenarioError, match="needs its own profile, gpu_name and gpu_memory_gb"):
        parse_scenario({"fleet": {**fleet, "profile": None}})
    fleet.update(gpu_name="Toy GPU", gpu_memory_gb=8.0, max_num_seqs=8, max_num_batched_tokens=32)
    workload = {"kind": "fixed", "arrivals_s": [0.0, 0.01, 0.02], "prompt_tokens": 20}
    result = run(parse_scenario({"fleet": fleet, "workload": workload}))
    assert [r.status for r in result.records] == [200, 200, 200]
    with pytest.raises(ScenarioError, match="is of org/toy on TOYGPU"):
        parse_scenario({"fleet": {**fleet, "model": "org/other"}, "workload": workload})


def test_skewed_batches_pay_their_regimes_measured_share_toward_the_longest_context(tmp_path):
    profile_dir = write_profile(tmp_path)
    # skewed batches measured 10% of the way from mean-context to longest-context time when
    # the decodes run alone (pc 0), 40% beside a prefill chunk; more rows of the second kind
    rows = ["pc,t_mean_us,t_max_us,t_skew_us"] + [
        f"{pc},{m},{m + g},{m + g * share}"
        for pc, share in ((0, 0.1), (16, 0.4), (32, 0.4))
        for m, g in ((100, 50), (200, 80), (50, 10))
    ]
    (profile_dir / "tp1" / "skew.csv").write_text("\n".join(rows) + "\n")
    profile = store.from_source(importer.read_any(profile_dir), "x")
    assert profile["tp"]["1"]["skew_alpha"] == pytest.approx({"decode": 0.1, "mixed": 0.4})
    timing = store.timing(profile, 1, ())
    even = timing.batch_s(4, 0, 4 * 32, 0.0)
    skewed = timing.batch_s(4, 0, 4 * 32, 0.0, 0, 64)  # mean 32, longest 64
    gap_us = _attn_us(0, 0, 4, 64) - _attn_us(0, 0, 4, 32)
    assert skewed - even == pytest.approx(2 * 0.1 * gap_us / 1e6)  # two layers
    pairs = 16 * 8  # one fresh 16-token chunk
    even = timing.batch_s(4, 16, 4 * 32, pairs, 1)
    skewed = timing.batch_s(4, 16, 4 * 32, pairs, 1, 64)
    gap_us = _attn_us(16, 0, 4, 64) - _attn_us(16, 0, 4, 32)
    assert skewed - even == pytest.approx(2 * 0.4 * gap_us / 1e6)
    without = store.from_source(importer.read_any(write_profile(tmp_path / "b")), "x")
    assert without["tp"]["1"]["skew_alpha"] == {"decode": 0.0, "mixed": 0.0}  # not measured


V0 = (
    Path(__file__).parent.parent / "data" / "profiles_v0" / "perf_models" / "TOYGPU" / "org" / "toy"
)


def test_the_older_per_layer_layout_imports_to_the_same_step_model(tmp_path, capsys):
    """tests/data/profiles_v0: tp1 complete, tp2 without attention tables (left out, said so);
    attention is prefill + decode from their two tables; the sampler was not measured."""
    out = tmp_path / "toy.json.gz"
    assert main(["profile", "import", str(V0), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "org/toy on TOYGPU: tp 1" in printed
    assert "left out: tp2/ lacks predictions/attn_prefill_predictions.csv" in printed
    assert "sampler: not measured" in printed
    profile = store.read(out)
    assert profile["config"]["layers"] == 2  # from model_config/org/toy.json (ISPASS'26 place)
    assert "PyTorch profiler hooks" in profile["provenance"]["profiler"]
    chunks = {row[0] for row in profile["tp"]["1"]["attention"] if row[0] > 0}
    assert chunks == {32, 64, 128, 160}  # 96 equals both neighbours: dropped, nothing changes
    timing = store.timing(profile, 1, ())
    # 3 decodes (mean context 100) and an 80-token chunk after 64 cached tokens: 83 tokens;
    # per layer 6 ops at 2000 + 100 T ns, once per step embedding 1000 + 100 T and final norm
    # 2000 + 100 T, attention prefill 5000 + 640 + 2 x 64 plus decode 3000 + 50 x 3 + 100,
    # LM head 50000 + 100 x 4 rows
    expected_ns = 2 * 6 * 10_300 + 9_300 + 10_300 + 2 * (5_768 + 3_250) + 50_400
    got = timing.batch_s(3, 80, 300, 80 * (64 + 40), prefill_seqs=1)
    assert got == pytest.approx(expected_ns / 1e9)
    assert timing.attention.at(96, 64, 0, 0) == pytest.approx(5_768 / 1e9)


def test_an_older_layout_that_cannot_time_attention_is_refused_naming_the_files(tmp_path):
    broken = tmp_path / "perf_models" / "TOYGPU" / "org" / "toy"
    shutil.copytree(V0, broken)
    (broken / "tp1" / "predictions" / "attn_decode_predictions.csv").unlink()
    with pytest.raises(
        source.ProfileError,
        match=r"no tensor-parallel degree is complete: tp1/ lacks predictions/attn_decode_"
        r"predictions\.csv; tp2/ lacks",
    ):
        importer.read_any(broken)
    with pytest.raises(source.ProfileError, match=r"neither a profile directory \(no meta\.yaml"):
        importer.read_any(tmp_path)
