"""Reading LLMServingSim's older per-layer profile layout (its v0 perf models, MIT).

Rule kept here: a directory ``perf_models/<GPU>/<org>/<model>/`` (``profiler/v0/`` in today's
LLMServingSim, ``llm_profile/`` in its ISPASS'26 artifact) is read as its files say and turned
into the same :class:`~narwhal.sim.profiles.source.SourceProfile` the current layout gives; what
it lacks is refused naming the file or column. Per tensor-parallel degree ``tp<N>/``:
``layers.csv`` (layer_name, input, kv_cache, tp_size, latency(ns)): every token-wise operator
of one layer against its tokens, plus the embedding, final norm and LM head;
``predictions/attn_prefill_predictions.csv`` (kv_cache_size, prefill_chunk_size, prediction in
ns) and ``predictions/attn_decode_predictions.csv`` (batch_size, kv_cache_size, prediction in
ns): attention as LLMServingSim's own simulator reads it, prefill and decode apart, a step paying
both (an *additive* attention table). A degree without the two prediction tables cannot time
attention: it is left out, and the import says so; none complete is an error.

What the layout does not hold, and what is taken instead: no GPU name (the directory's hardware
key), no date (the profiler is not vLLM: PyTorch hooks on the Hugging Face model, named in the
provenance), no sampler timing (taken as zero, stated in the notes), no skewed
batch measurements (no skew correction). ``layers.csv``'s own ``attn`` row (prefill without a
cache, a fallback in LLMServingSim) is not read: the prediction tables cover it. The model's
shape comes from its Hugging Face config, found as :func:`~.source.find_model_config` finds it.

Theory of operation: the prefill prediction table is dense over chunk sizes (every 32 tokens up
to 131,072) and flat over most of them; a chunk column equal, at every cached size, to both of
its neighbours is dropped, which changes no interpolated value and keeps the stored profile small.
"""

from __future__ import annotations

from pathlib import Path

from narwhal.sim.profiles.source import (
    ProfileError,
    RawTables,
    SourceProfile,
    csv_number,
    csv_rows,
    find_model_config,
    read_model_config,
)

LAYERS = "layers.csv"
PREFILL = "predictions/attn_prefill_predictions.csv"
DECODE = "predictions/attn_decode_predictions.csv"
PROFILER = (
    "LLMServingSim's llm_profile: PyTorch profiler hooks on the Hugging Face model's layers, "
    "eager (nvcr.io/nvidia/pytorch:25.01, transformers 4.57.3); attention tables from its "
    "scikit-learn predictor over measured attention times"
)
NOT_DENSE = frozenset({"attn", "lm_head"})  # attention: the prediction tables; LM head: per row


def is_v0(profile_dir: Path) -> bool:
    """Whether ``profile_dir`` is laid out as the older per-layer profiles are."""
    return any((tp_dir / LAYERS).is_file() for tp_dir in profile_dir.glob("tp*"))


def _degree(tp_dir: Path) -> int | None:
    digits = tp_dir.name[2:]
    return int(digits) if tp_dir.is_dir() and digits.isdigit() else None


Points = list[tuple[float, float]]


def _layers(path: Path, tp: int) -> tuple[dict[str, Points], Points]:
    columns = ("layer_name", "input", "kv_cache", "tp_size", "latency(ns)")
    dense: dict[str, Points] = {}
    lm_head: Points = []
    for row in csv_rows(path, columns):
        if int(csv_number(row, "tp_size", path)) != tp:
            raise ProfileError(f"{path}: a row of tp_size {row['tp_size']} in tp{tp}/")
        name = row["layer_name"]
        point = (csv_number(row, "input", path), csv_number(row, "latency(ns)", path) / 1e9)
        if name == "lm_head":
            lm_head.append(point)
        elif name not in NOT_DENSE:
            dense.setdefault(name, []).append(point)
    if not lm_head:
        raise ProfileError(f"{path}: no lm_head rows")
    return dense, lm_head


def _thin_chunks(
    table: dict[float, dict[float, float]],
) -> list[tuple[float, float, float, float, float]]:
    """Prefill rows (chunk, cached, 0, 0, seconds), without chunk columns that equal both of
    their neighbours (see the module docstring)."""
    chunks = sorted(table)
    kept: list[tuple[float, float, float, float, float]] = []
    for i, chunk in enumerate(chunks):
        column = table[chunk]
        if 0 < i < len(chunks) - 1 and column == table[chunks[i - 1]] == table[chunks[i + 1]]:
            continue
        kept.extend((chunk, cached, 0.0, 0.0, t) for cached, t in sorted(column.items()))
    return kept


def _attention(tp_dir: Path) -> list[tuple[float, float, float, float, float]]:
    prefill_path, decode_path = tp_dir / PREFILL, tp_dir / DECODE
    prefill: dict[float, dict[float, float]] = {}
    for row in csv_rows(prefill_path, ("kv_cache_size", "prefill_chunk_size", "prediction")):
        chunk = csv_number(row, "prefill_chunk_size", prefill_path)
        cached = csv_number(row, "kv_cache_size", prefill_path)
        if chunk <= 0:
            raise ProfileError(f"{prefill_path}: prefill_chunk_size {chunk:g} is not positive")
        seconds = csv_number(row, "prediction", prefill_path) / 1e9
        prefill.setdefault(chunk, {}).setdefault(cached, seconds)  # first wins, as LLMServingSim
    decode: dict[tuple[float, float], float] = {}
    for row in csv_rows(decode_path, ("batch_size", "kv_cache_size", "prediction")):
        decodes = csv_number(row, "batch_size", decode_path)
        if decodes <= 0:
            raise ProfileError(f"{decode_path}: batch_size {decodes:g} is not positive")
        key = (decodes, csv_number(row, "kv_cache_size", decode_path))
        decode.setdefault(key, csv_number(row, "prediction", decode_path) / 1e9)
    rows = _thin_chunks(prefill)
    rows.extend((0.0, 0.0, n, ctx, t) for (n, ctx), t in sorted(decode.items()))
    return rows


def read_v0_profile(profile_dir: Path, model_config: Path | None = None) -> SourceProfile:
    """Read an older-layout profile directory (see the module docstring)."""
    parts = profile_dir.resolve().parts
    if len(parts) < 3:
        raise ProfileError(f"{profile_dir}: not perf_models/<GPU>/<org>/<model>/")
    gpu, model = parts[-3], f"{parts[-2]}/{parts[-1]}"
    degrees = sorted(
        (tp, tp_dir) for tp_dir in profile_dir.glob("tp*") if (tp := _degree(tp_dir)) is not None
    )
    if not degrees:
        raise ProfileError(f"{profile_dir}: no tp<N>/ directory")
    tables: dict[int, RawTables] = {}
    notes: list[str] = []
    lacking: list[str] = []
    for tp, tp_dir in degrees:
        absent = [name for name in (LAYERS, PREFILL, DECODE) if not (tp_dir / name).is_file()]
        if absent:
            lacking.append(f"tp{tp}/ lacks {', '.join(absent)}")
            continue
        dense, lm_head = _layers(tp_dir / LAYERS, tp)
        tables[tp] = RawTables(
            dense=dense,
            per_sequence={"lm_head": lm_head},
            attention=_attention(tp_dir),
            skew=[],
            attention_form="additive",
        )
    if not tables:
        raise ProfileError(
            f"{profile_dir}: no tensor-parallel degree is complete: " + "; ".join(lacking)
        )
    notes.extend(f"left out: {text}" for text in lacking)
    notes.append("sampler: not measured by this layout, taken as zero")
    config_path = model_config or find_model_config(profile_dir, model)
    return SourceProfile(
        gpu=gpu,
        gpu_name=gpu,
        model=model,
        dtype="bf16",
        meta={"profiler": PROFILER},
        config=read_model_config(config_path),
        tables=tables,
        notes=tuple(notes),
    )
