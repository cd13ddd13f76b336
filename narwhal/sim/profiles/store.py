"""Narwhal's profile format: one GPU, one model, its measured operator tables per TP degree.

Rule kept here: a stored profile holds measurements and their provenance, never a fitted
constant: the token-wise operator curves, the LM head and sampler curves, the attention table
(one grid over mixed steps, or prefill and decode apart: ``attention_form = "additive"``; from
LLMServingSim's older layout it is that project's predictor's table over its measured times, as
the provenance says; from Vidur's, its measured prefill and decode kernels), the model's shape
and where every number came from (source, licence, vLLM version or profiler, when, what the
import left out or derived: ``notes``). What the step model does with them is :mod:`.opstep`'s.
The bundled profiles are files of this format in ``narwhal/sim/data/profiles/`` named
``<GPU>__<org>__<model>.json.gz``.

Theory of operation: :func:`from_source` turns an imported profile into the stored
dictionary; :func:`write` / :func:`read` move it to and from gzip'd JSON (written without a
timestamp, so the same input gives the same bytes); :func:`timing` builds the engine's
:class:`~narwhal.sim.profiles.opstep.OperatorStepTiming` for one TP degree; :func:`residuals`
states each table's interpolation error (every interior point predicted from its neighbours).
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from statistics import mean
from typing import Any

from narwhal.sim.profiles.opstep import (
    OperatorStepTiming,
    SkewAlpha,
    fold_ops,
    skew_alphas,
)
from narwhal.sim.profiles.source import ModelConfig, ProfileError, SourceProfile
from narwhal.sim.profiles.tables import AdditiveAttention, AttentionGrid, Curve, leave_one_out

FORMAT = "narwhal-op-profile/2"  # 2: skew_alpha per regime (decode, mixed)
BUNDLED_DIR = ("data", "profiles")
LLMSERVINGSIM_LICENCE = "MIT (LLMServingSim, Copyright (c) 2024 CASYS Lab at KAIST)"


def _round(seconds: float) -> float:
    return float(f"{seconds:.6g}")


def from_source(source: SourceProfile, origin: str) -> dict[str, Any]:
    """The stored form of an imported profile (``origin``: where it was read from)."""
    meta = source.meta
    engine = meta.get("engine_effective") or {}
    tps: dict[str, Any] = {}
    for tp, tables in sorted(source.tables.items()):
        tps[str(tp)] = {
            "dense": {k: [[s, _round(t)] for s, t in v] for k, v in sorted(tables.dense.items())},
            "per_sequence": {
                k: [[s, _round(t)] for s, t in v] for k, v in sorted(tables.per_sequence.items())
            },
            "attention": [[c, k, n, x, _round(t)] for c, k, n, x, t in tables.attention],
            "skew_alpha": _skew_alpha(tables.skew),
        }
        if tables.attention_form != "grid":
            tps[str(tp)]["attention_form"] = tables.attention_form
    provenance: dict[str, Any] = {
        "source": origin,
        "licence": str(meta.get("licence") or LLMSERVINGSIM_LICENCE),
        "vllm_version": str(meta.get("vllm_version", "")),
        "profiled_at": str(meta.get("profiled_at", "")),
        "enforce_eager": bool(engine.get("enforce_eager", False)),
    }
    if meta.get("profiler"):
        provenance["profiler"] = str(meta["profiler"])
    if source.notes:
        provenance["notes"] = list(source.notes)
    return {
        "format": FORMAT,
        "gpu": source.gpu,
        "gpu_name": source.gpu_name,
        "model": source.model,
        "dtype": source.dtype,
        "config": source.config.as_dict(),
        "provenance": provenance,
        "tp": tps,
    }


def _skew_alpha(rows: list[tuple[float, float, float, float]]) -> dict[str, float]:
    alphas = skew_alphas(rows)
    return {"decode": round(alphas.decode, 4), "mixed": round(alphas.mixed, 4)}


def write(profile: dict[str, Any], path: Path) -> None:
    data = json.dumps(profile, separators=(",", ":"), sort_keys=True).encode()
    with path.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as out:
        out.write(data)


def read(path: Path) -> dict[str, Any]:
    """A stored profile (gzip'd or plain JSON), checked for the fields the step model reads."""
    try:
        blob = path.read_bytes()
        text = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
        profile = json.loads(text)
    except (OSError, ValueError) as error:
        raise ProfileError(f"{path}: {error}") from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT:
        raise ProfileError(
            f"{path}: not a Narwhal profile of format {FORMAT!r} (an older one: import its "
            "source again with narwhal profile import)"
        )
    missing = [k for k in ("gpu", "model", "config", "tp") if k not in profile]
    if missing:
        raise ProfileError(f"{path}: no {', '.join(missing)}")
    return profile


@lru_cache(maxsize=16)
def read_cached(path: str) -> dict[str, Any]:
    """:func:`read` of a file a scenario names, once per process."""
    return read(Path(path))


def bundled_name(gpu: str, model: str) -> str:
    return f"{gpu}__{model.replace('/', '__')}.json.gz"


@lru_cache(maxsize=16)
def bundled(gpu: str, model: str) -> dict[str, Any]:
    """The bundled profile of ``model`` on ``gpu``, or a ProfileError listing what is bundled."""
    folder = resources.files("narwhal.sim").joinpath(*BUNDLED_DIR)
    entry = folder.joinpath(bundled_name(gpu, model))
    if not entry.is_file():
        have = ", ".join(f"{g} {m}" for g, m in bundled_catalog()) or "none"
        raise ProfileError(f"no bundled profile for {model} on {gpu}; bundled: {have}")
    with resources.as_file(entry) as path:
        return read(path)


def bundled_catalog() -> list[tuple[str, str]]:
    """(gpu, model) of every bundled profile."""
    folder = resources.files("narwhal.sim").joinpath(*BUNDLED_DIR)
    out = []
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".json.gz"):
            gpu, _, model = name[: -len(".json.gz")].partition("__")
            out.append((gpu, model.replace("__", "/")))
    return sorted(out)


def model_config(profile: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**{k: int(v) for k, v in profile["config"].items()})


def _tables(profile: dict[str, Any], tp: int) -> dict[str, Any]:
    tables = profile["tp"].get(str(tp))
    if tables is None:
        have = ", ".join(sorted(profile["tp"]))
        raise ProfileError(
            f"the {profile['gpu']} profile of {profile['model']} has no tp {tp} (has {have})"
        )
    return dict(tables)


def attention(tables: dict[str, Any]) -> AttentionGrid | AdditiveAttention:
    """A TP degree's attention table: one grid over mixed steps, or prefill and decode apart
    (``attention_form = "additive"``, LLMServingSim's older layout)."""
    points = map(tuple, tables["attention"])
    form = tables.get("attention_form", "grid")
    if form == "additive":
        return AdditiveAttention(points)
    if form != "grid":
        raise ProfileError(f"attention_form {form!r} is neither 'grid' nor 'additive'")
    return AttentionGrid(points)


def timing(profile: dict[str, Any], tp: int, graph_sizes: tuple[int, ...]) -> OperatorStepTiming:
    """The step timing of one engine of ``tp`` ranks (``graph_sizes``: CUDA-graph capture
    sizes, empty for an eager engine; see :func:`~.opstep.capture_sizes`); its KV bytes per
    token are every rank's together."""
    tables = _tables(profile, tp)
    config = model_config(profile)
    dense = {name: Curve(map(tuple, pts)) for name, pts in tables["dense"].items()}
    per_seq = {name: Curve(map(tuple, pts)) for name, pts in tables["per_sequence"].items()}
    return OperatorStepTiming(
        fold_ops(dense, per_seq),
        attention(tables),
        config.layers,
        config.shape(tp).kv_bytes_per_token_per_rank * tp,
        graph_sizes,
        SkewAlpha(**{k: float(v) for k, v in tables["skew_alpha"].items()}),
    )


def residuals(profile: dict[str, Any]) -> list[tuple[int, str, int, float, float]]:
    """Per TP degree and table: (tp, table, interior points, mean |error|, max |error|) of
    predicting each measured point from its neighbours."""
    out = []
    for tp_text in sorted(profile["tp"], key=int):
        tables = profile["tp"][tp_text]
        curves = {**tables["dense"], **tables["per_sequence"]}
        for name, pts in sorted(curves.items()):
            errors = [abs(e) for e in leave_one_out(Curve(map(tuple, pts)))]
            if errors:
                out.append((int(tp_text), name, len(errors), mean(errors), max(errors)))
        grid = attention(tables)
        grid_errors = [abs(e) for e in grid.leave_one_out()]
        if grid_errors:
            out.append(
                (int(tp_text), "attention", len(grid_errors), mean(grid_errors), max(grid_errors))
            )
    return out
