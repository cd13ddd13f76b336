"""Vidur's compute profiles (mlp.csv, attention.csv) imported into the per-operator step model."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.sim.profiles import importer, source, store

ROOT = Path(__file__).parent.parent / "data" / "profiles_vidur"
LLAMA = ROOT / "data" / "profiling" / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf"
# the per-layer operators mlp.csv times, each once per layer in Vidur's step and here
PER_LAYER = (
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "input_layernorm",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


def _mlp_medians_s(tp: int, tokens: int) -> dict[str, float]:
    """The fixture's mlp.csv row at (tp, tokens), every operator's median in seconds."""
    with (LLAMA / "mlp.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["num_tensor_parallel_workers"] == str(tp) and row["num_tokens"] == str(tokens):
                return {
                    key[len("time_stats.") : -len(".median")]: float(value) / 1e3
                    for key, value in row.items()
                    if key.startswith("time_stats.") and key.endswith(".median")
                }
    raise AssertionError(f"no mlp.csv row at tp {tp}, {tokens} tokens")


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT, tmp_path / "vidur")
    return tmp_path / "vidur" / LLAMA.relative_to(ROOT)


def _rewrite(path: Path, drop_column: str = "", edit=None) -> None:
    """Rewrite a CSV without ``drop_column`` and with ``edit(row)`` applied to every row."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields = [f for f in reader.fieldnames or [] if f != drop_column]
        rows = list(reader)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            if edit is not None:
                edit(row)
            writer.writerow(row)


def test_a_vidur_profile_imports_through_the_cli_and_times_steps_from_its_tables(tmp_path, capsys):
    out = tmp_path / "llama2.json.gz"
    assert main(["profile", "import", str(LLAMA), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "meta-llama/Llama-2-7b-hf on H100: tp 1" in printed
    # mlp.csv measured tp 1 and 2, attention.csv only tp 1
    assert "left out: tp 2, not measured at this shape in attention.csv" in printed
    assert "lm_head: not measured by this layout" in printed
    assert "embedding measured at vocab_size 32768; the model's is 32000" in printed
    residual_rows = {line.split()[1] for line in printed.splitlines() if line.startswith("  1 ")}
    assert {*PER_LAYER, "embedding", "attn_kv_cache_save", "attention"} <= residual_rows
    profile = store.read(out)
    assert profile["provenance"]["source"] == (
        "Vidur data/profiling/compute/h100/meta-llama/Llama-2-7b-hf"
    )
    assert profile["provenance"]["licence"].startswith("MIT (Vidur")
    assert profile["config"]["layers"] == 32 and profile["tp"]["1"]["attention_form"] == "additive"
    timing = store.timing(profile, 1, ())
    # 4 decodes at context 384 (between the attention table's 256 and 512): 4 tokens, 4 rows
    ops = _mlp_medians_s(1, 4)
    attention_ms = 0.008 + 1e-5 * 4 * 384  # the fixture's decode table, linear in its sizes
    kv_save_ms = 0.005 + 1e-5 * 4
    per_layer = sum(ops[name] for name in PER_LAYER) + (attention_ms + kv_save_ms) / 1e3
    lm_head = ops["mlp_up_proj"] * 32000 / (2 * 11008)  # gated: up-projection 2 x 11008 wide
    expected = 32 * per_layer + ops["emb"] + lm_head
    assert timing.batch_s(4, 0, 4 * 384, 0.0) == pytest.approx(expected, rel=1e-4)
    # a 256-token chunk after 256 cached tokens: prefill attention, no decode term
    ops = _mlp_medians_s(1, 256)
    prefill_ms = 0.01 + 2e-7 * 256 * (256 + 256)
    per_layer = sum(ops[name] for name in PER_LAYER) + (prefill_ms + 0.005 + 1e-5 * 256) / 1e3
    lm_head = _mlp_medians_s(1, 1)["mlp_up_proj"] * 32000 / 22016  # one row: the chunk's last
    expected = 32 * per_layer + ops["emb"] + lm_head
    got = timing.batch_s(0, 256, 0, 256 * (256 + 128), prefill_seqs=1)
    assert got == pytest.approx(expected, rel=1e-4)
    # prefill and decode measured apart: a mixed step's attention is their sum
    assert timing.attention.at(128, 128, 4, 384) == pytest.approx(
        (0.01 + 2e-7 * 128 * 256 + attention_ms) / 1e3
    )


def test_a_vidur_profile_without_a_file_or_column_is_refused_naming_it(tmp_path, capsys):
    profile_dir = _copy(tmp_path)
    attention = profile_dir / "attention.csv"
    saved = attention.read_bytes()
    attention.unlink()
    assert main(["profile", "import", str(profile_dir), "--out", str(tmp_path / "x")]) == 2
    assert "no attention.csv (Vidur's profile has both)" in capsys.readouterr().err
    attention.write_bytes(saved)
    _rewrite(attention, drop_column="time_stats.attn_decode.median")
    with pytest.raises(source.ProfileError, match=r"no column time_stats\.attn_decode\.median"):
        importer.read_any(profile_dir)
    attention.write_bytes(saved)
    _rewrite(profile_dir / "mlp.csv", drop_column="time_stats.mlp_up_proj.median")
    with pytest.raises(source.ProfileError, match=r"mlp\.csv: no column time_stats\.mlp_up_proj"):
        importer.read_any(profile_dir)
    (profile_dir / "config.json").unlink()
    with pytest.raises(source.ProfileError, match=r"no model config for meta-llama/Llama-2-7b"):
        importer.read_any(profile_dir)
    with pytest.raises(source.ProfileError, match=r"nor Vidur's \(no mlp\.csv"):
        importer.read_any(tmp_path)


def test_a_vidur_profile_of_another_shape_is_refused(tmp_path):
    profile_dir = _copy(tmp_path)
    other = tmp_path / "gqa.json"
    config = json.loads((profile_dir / "config.json").read_text())
    other.write_text(json.dumps({**config, "num_key_value_heads": 8}))
    with pytest.raises(source.ProfileError, match=r"mlp\.csv: no row measured at the model's"):
        importer.read_any(profile_dir, other)


def _to_tp4(row: dict[str, str]) -> None:  # mlp.csv has tp 1 and 2, attention.csv then only 4
    row["num_tensor_parallel_workers"] = "4"


def _two_block_sizes(row: dict[str, str]) -> None:
    if row["batch_size"] == "8":
        row["block_size"] = "32"


def _no_decode_time(row: dict[str, str]) -> None:
    if row["prefill_chunk_size"] == "0":
        row["time_stats.attn_decode.median"] = ""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_to_tp4, r"no tensor-parallel degree is in both"),
        (_two_block_sizes, r"tp 1 holds block sizes 16, 32"),
        (_no_decode_time, r"attn_decode\.median is empty in a row"),
    ],
)
def test_unusable_vidur_attention_rows_are_refused(tmp_path, edit, message):
    profile_dir = _copy(tmp_path)
    _rewrite(profile_dir / "attention.csv", edit=edit)
    with pytest.raises(source.ProfileError, match=message):
        importer.read_any(profile_dir)
