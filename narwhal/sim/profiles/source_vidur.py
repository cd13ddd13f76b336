"""Reading Vidur's compute profiles (microsoft/vidur, MIT) into a per-operator profile.

Rule kept here: a directory ``data/profiling/compute/<gpu>/<org>/<model>/`` is read as its two
files say and turned into the same :class:`~narwhal.sim.profiles.source.SourceProfile` the
LLMServingSim layouts give; a missing file or column is refused naming it, as is a file whose
rows were measured for another model's shape. The files, as Vidur's profilers write them (one
row per measured input, times in milliseconds, each operator as ``time_stats.<op>.{min, max,
mean, median, std}``; Vidur's predictor reads the median, and so does this):

- ``mlp.csv``: the decoder layer's token-wise operators (``attn_pre_proj``, ``attn_rope``,
  ``attn_post_proj``, ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj``, the norms, ``add``) and the
  embedding (``emb``) against ``num_tokens``, per ``num_tensor_parallel_workers``, with the
  shape they were measured at (``n_head``, ``n_kv_head``, ``n_embd``, ``n_expanded_embd``,
  ``use_gated_mlp``);
- ``attention.csv``: one layer's attention kernels per ``num_tensor_parallel_workers`` and
  ``block_size``: a prefill chunk (``prefill_chunk_size`` > 0, one sequence) after
  ``kv_cache_size`` cached tokens as ``attn_prefill``, a batch of ``batch_size`` decodes at
  context ``kv_cache_size`` as ``attn_decode`` (measured apart: an *additive* attention table,
  a mixed step paying both, as Vidur's predictor adds them), and ``attn_kv_cache_save`` (the KV
  write) against the step's tokens (``max(prefill_chunk_size, batch_size)``, Vidur's rule).

What the layout does not hold, and what is taken instead (each stated in the import's notes):
no LM head (Vidur's step time leaves it out; here it is the measured ``mlp_up_proj`` GEMM, the
same rows against the same hidden size, scaled by output width: ``vocab / up-projection width``,
since a GEMM's time at fixed rows and depth grows with its width), no final norm (left out: one
norm per step against two per layer), no sampler (zero). The all-reduces of a TP > 1 engine
are the step model's own (``narwhal/sim/profiles/gpus.py``), not Vidur's ``network/`` tables.
The model's shape comes from its Hugging Face config, found as
:func:`~.source.find_model_config` finds it (Vidur keeps none: ``config.json`` beside the CSVs,
or ``--model-config``); rows of another shape are not read (a file holding only those is
refused), a vocabulary that differs from the profile's (Vidur pads Llama 2's to 32,768) is noted.

Theory of operation: each file is read once into rows; a tensor-parallel degree is imported when
both files measured it at the model's shape, and left out, said so, when only one did. The
attention rows of one degree must share one block size (Vidur filters by the engine's).
"""

from __future__ import annotations

from pathlib import Path

from narwhal.sim.profiles.source import (
    ModelConfig,
    ProfileError,
    RawTables,
    SourceProfile,
    csv_number,
    csv_rows,
    find_model_config,
    read_model_config,
)

MLP = "mlp.csv"
ATTENTION = "attention.csv"
PROFILER = (
    "Vidur's profilers (vidur/profiling/mlp and attention on sarathi-serve's kernels, fp16): "
    "the median of each operator's CUDA time per input"
)
LICENCE = "MIT (Vidur, Copyright (c) Microsoft Corporation)"
# the operators Vidur's own predictor cannot do without (norms and add it takes as zero if absent)
NEEDED_OPS = (
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
)
MLP_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
ATTENTION_SHAPE = ("n_embd", "n_q_head", "n_kv_head")
ATTENTION_COLUMNS = (
    *ATTENTION_SHAPE,
    "block_size",
    "num_tensor_parallel_workers",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "time_stats.attn_prefill.median",
    "time_stats.attn_decode.median",
)
TP = "num_tensor_parallel_workers"
Points = list[tuple[float, float]]


def is_vidur(profile_dir: Path) -> bool:
    """Whether ``profile_dir`` is laid out as Vidur's compute profiles are."""
    return (profile_dir / MLP).is_file() or (profile_dir / ATTENTION).is_file()


def _median_ms(row: dict[str, str], column: str, path: Path) -> float | None:
    """A median in seconds, or None where the row did not run that operator (an empty cell)."""
    if not (row.get(column) or "").strip():
        return None
    ms = csv_number(row, column, path)
    if ms < 0:
        raise ProfileError(f"{path}: {column} = {ms:g} is negative")
    return ms / 1e3


def _shape_of(row: dict[str, str], columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(row[c].strip() for c in columns)


def _expected_mlp_shape(config: ModelConfig, gated: str) -> tuple[str, ...]:
    return (str(config.heads), str(config.kv_heads), str(config.hidden), str(config.inter), gated)


def _read_mlp(path: Path, config: ModelConfig) -> tuple[dict[int, dict[str, Points]], bool, int]:
    """Per TP degree, each operator's (tokens, seconds) at the model's shape; whether the MLP is
    gated; the vocabulary the profile measured the embedding at."""
    rows = csv_rows(path, (*MLP_SHAPE, "vocab_size", "num_tokens", TP))
    ops = sorted({c[len("time_stats.") : -len(".median")] for c in rows[0] if _is_median(c)})
    absent = [op for op in NEEDED_OPS if op not in ops]
    if absent:
        raise ProfileError(
            f"{path}: no column {', '.join(f'time_stats.{op}.median' for op in absent)}"
        )
    found: dict[int, dict[str, Points]] = {}
    gated: set[str] = set()
    vocab: set[int] = set()
    seen: set[tuple[str, ...]] = set()
    for row in rows:
        shape = _shape_of(row, MLP_SHAPE)
        seen.add(shape)
        if shape != _expected_mlp_shape(config, shape[-1]):
            continue
        gated.add(shape[-1])
        vocab.add(int(csv_number(row, "vocab_size", path)))
        tp = int(csv_number(row, TP, path))
        tokens = csv_number(row, "num_tokens", path)
        curves = found.setdefault(tp, {})
        for op in ops:
            seconds = _median_ms(row, f"time_stats.{op}.median", path)
            if seconds is not None:
                curves.setdefault("embedding" if op == "emb" else op, []).append((tokens, seconds))
    if not found:
        raise ProfileError(
            f"{path}: no row measured at the model's shape ({', '.join(MLP_SHAPE[:4])} = "
            f"{', '.join(_expected_mlp_shape(config, '')[:4])}); it holds "
            + "; ".join(", ".join(s[:4]) for s in sorted(seen))
        )
    if len(gated) > 1 or len(vocab) > 1:
        raise ProfileError(f"{path}: rows of the model's shape disagree on use_gated_mlp or vocab")
    return found, gated.pop().lower() == "true", vocab.pop()


def _is_median(column: str) -> bool:
    return column.startswith("time_stats.") and column.endswith(".median")


def _read_attention(
    path: Path, config: ModelConfig
) -> dict[int, tuple[list[tuple[float, float, float, float, float]], Points]]:
    """Per TP degree, the additive attention rows (seconds) and the KV write against tokens."""
    rows = csv_rows(path, ATTENTION_COLUMNS)
    want = (str(config.hidden), str(config.heads), str(config.kv_heads))
    save = "time_stats.attn_kv_cache_save.median"
    found: dict[int, tuple[list[tuple[float, float, float, float, float]], Points]] = {}
    blocks: dict[int, set[str]] = {}
    seen: set[tuple[str, ...]] = set()
    for row in rows:
        shape = _shape_of(row, ATTENTION_SHAPE)
        seen.add(shape)
        if shape != want:
            continue
        tp = int(csv_number(row, TP, path))
        blocks.setdefault(tp, set()).add(row["block_size"].strip())
        chunk = csv_number(row, "prefill_chunk_size", path)
        cached = csv_number(row, "kv_cache_size", path)
        batch = csv_number(row, "batch_size", path)
        attention, kv_save = found.setdefault(tp, ([], []))
        if chunk > 0:
            if batch != 1:
                raise ProfileError(f"{path}: a prefill row of batch_size {batch:g} (Vidur's is 1)")
            column = "time_stats.attn_prefill.median"
            point = (chunk, cached, 0.0, 0.0)
        else:
            if batch <= 0:
                raise ProfileError(f"{path}: a decode row of batch_size {batch:g}")
            column = "time_stats.attn_decode.median"
            point = (0.0, 0.0, batch, cached)
        seconds = _median_ms(row, column, path)
        if seconds is None:
            raise ProfileError(f"{path}: {column} is empty in a row it times: {_where(row)}")
        attention.append((*point, seconds))
        written = _median_ms(row, save, path) if save in row else None
        if written is not None:
            kv_save.append((max(chunk, batch), written))
    if not found:
        raise ProfileError(
            f"{path}: no row measured at the model's shape ({', '.join(ATTENTION_SHAPE)} = "
            f"{', '.join(want)}); it holds " + "; ".join(", ".join(s) for s in sorted(seen))
        )
    mixed = {tp: sorted(sizes) for tp, sizes in blocks.items() if len(sizes) > 1}
    if mixed:
        tp, sizes = min(mixed.items())
        raise ProfileError(f"{path}: tp {tp} holds block sizes {', '.join(sizes)}; give one")
    return found


def _where(row: dict[str, str]) -> str:
    keys = ("prefill_chunk_size", "kv_cache_size", "batch_size", TP)
    return ", ".join(f"{k} {row[k]}" for k in keys)


def _up_width(config: ModelConfig, gated: bool) -> int:
    """The up-projection's output width (a gated MLP's gate and up projections are one GEMM)."""
    return config.inter * (2 if gated else 1)


def _lm_head(up_proj: Points, config: ModelConfig, gated: bool) -> Points:
    """The LM head's (rows, seconds), from the measured up-projection (module docstring)."""
    width = _up_width(config, gated)
    return [(rows, seconds * config.vocab / width) for rows, seconds in up_proj]


def read_vidur_profile(profile_dir: Path, model_config: Path | None = None) -> SourceProfile:
    """Read a Vidur compute profile directory (see the module docstring)."""
    parts = profile_dir.resolve().parts
    if len(parts) < 3:
        raise ProfileError(f"{profile_dir}: not data/profiling/compute/<gpu>/<org>/<model>/")
    key, model = parts[-3], f"{parts[-2]}/{parts[-1]}"
    absent = [name for name in (MLP, ATTENTION) if not (profile_dir / name).is_file()]
    if absent:
        raise ProfileError(f"{profile_dir}: no {', '.join(absent)} (Vidur's profile has both)")
    config = read_model_config(model_config or find_model_config(profile_dir, model))
    dense, gated, vocab = _read_mlp(profile_dir / MLP, config)
    attention = _read_attention(profile_dir / ATTENTION, config)
    tables: dict[int, RawTables] = {}
    notes: list[str] = []
    for tp in sorted(set(dense) | set(attention)):
        if tp not in attention or tp not in dense:
            lacking = ATTENTION if tp not in attention else MLP
            notes.append(f"left out: tp {tp}, not measured at this shape in {lacking}")
            continue
        rows, kv_save = attention[tp]
        curves = dict(dense[tp])
        if kv_save:
            curves["attn_kv_cache_save"] = kv_save
        tables[tp] = RawTables(
            dense=curves,
            per_sequence={"lm_head": _lm_head(dense[tp]["mlp_up_proj"], config, gated)},
            attention=rows,
            skew=[],
            attention_form="additive",
        )
    if not tables:
        raise ProfileError(
            f"{profile_dir}: no tensor-parallel degree is in both {MLP} and "
            f"{ATTENTION}: " + "; ".join(notes)
        )
    notes.append(
        "lm_head: not measured by this layout, taken as the measured mlp_up_proj scaled by "
        f"vocab / up-projection width ({config.vocab} / {_up_width(config, gated)})"
    )
    notes.append("final norm: not measured by this layout, left out")
    notes.append("sampler: not measured by this layout, taken as zero")
    if vocab != config.vocab:
        notes.append(f"embedding measured at vocab_size {vocab}; the model's is {config.vocab}")
    return SourceProfile(
        gpu=key.upper(),
        gpu_name=key.upper(),
        model=model,
        dtype="fp16",
        # the operators ran eagerly (PyTorch, no CUDA graphs), timed by their kernels' CUDA time
        meta={
            "profiler": PROFILER,
            "licence": LICENCE,
            "engine_effective": {"enforce_eager": True},
        },
        config=config,
        tables=tables,
        notes=tuple(notes),
    )
