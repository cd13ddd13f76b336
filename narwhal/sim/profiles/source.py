"""Reading a per-operator GPU profile in LLMServingSim's layout (MIT, casys-kaist/LLMServingSim).

Rule kept here: a profile directory ``profiler/perf/<GPU>/<org>/<model>/<dtype>/`` is read as
its files say, and whatever it lacks is refused with a message naming the missing file or field:
``meta.yaml`` (GPU, model, vLLM version, tensor-parallel degrees), per degree
``tp<N>/dense.csv`` (layer, tokens, time_us), ``tp<N>/attention.csv`` (prefill_chunk,
kv_prefill, n_decode, kv_decode, time_us) and ``tp<N>/per_sequence.csv`` (layer, sequences,
time_us). A profile with ``moe.csv``, or whose model config counts routed experts
(:data:`MOE_KEYS`, in every layout), is a mixture-of-experts model, which the dense step model
does not cover: refused. The model's shape comes from its Hugging Face ``config.json``: given,
else ``config.json`` in the profile directory, else ``configs/model/<org>/<model>.json`` of the
LLMServingSim checkout the profile sits in. The older layout (``perf_models/<GPU>/<org>/<model>/``)
is :mod:`.source_v0`'s; :mod:`.importer` picks the reader by what the directory holds.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narwhal.sim.model_shape import ModelShape

# the keys by which Hugging Face configs count a mixture-of-experts model's routed experts
# (Mixtral, Phi-MoE: num_local_experts; Qwen3-MoE: num_experts; DeepSeek: n_routed_experts)
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


class ProfileError(ValueError):
    """A profile or model config that cannot be used, with what is missing."""


@dataclass(frozen=True)
class ModelConfig:
    """The shape a step model and the KV sizing need, from a Hugging Face ``config.json``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int

    @classmethod
    def from_hf(cls, config: dict[str, Any], where: str) -> ModelConfig:
        for key in MOE_KEYS:
            experts = config.get(key)
            if isinstance(experts, int) and experts > 1:
                raise ProfileError(
                    f"{where}: a mixture-of-experts model ({key} {experts}); the step model "
                    "covers dense decoder models only"
                )
        needed = (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "intermediate_size",
            "vocab_size",
        )
        missing = [key for key in needed if not isinstance(config.get(key), int)]
        if missing:
            raise ProfileError(f"{where}: model config lacks {', '.join(missing)}")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            inter=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
        )

    def shape(self, tp: int, name: str = "profile") -> ModelShape:
        """This model split over ``tp`` ranks, as the memory, TP and KV rules read it."""
        return ModelShape(
            name=name,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            inter=self.inter,
            layers=self.layers,
            vocab=self.vocab,
            tp=tp,
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "inter": self.inter,
            "vocab": self.vocab,
        }


@dataclass(frozen=True)
class RawTables:
    """One tensor-parallel degree's measured tables, in seconds."""

    dense: dict[str, list[tuple[float, float]]]
    per_sequence: dict[str, list[tuple[float, float]]]
    attention: list[tuple[float, float, float, float, float]]
    # skew.csv: (prefill chunk tokens, mean-context time, longest-context time, skewed time)
    skew: list[tuple[float, float, float, float]]
    # "grid": one table over mixed steps; "additive": prefill rows (chunk, cached, 0, 0) and
    # decode rows (0, 0, decodes, context) measured apart, a step paying both (the older layout)
    attention_form: str = "grid"


@dataclass(frozen=True)
class SourceProfile:
    gpu: str  # the profile's hardware key, e.g. RTXPRO6000
    gpu_name: str  # as the device reports it
    model: str  # Hugging Face id
    dtype: str
    meta: dict[str, Any]
    config: ModelConfig
    tables: dict[int, RawTables]  # by tensor-parallel degree
    notes: tuple[str, ...] = ()  # what the import left out or took as zero, and why


def csv_rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise ProfileError(f"{path}: missing")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        absent = [c for c in columns if c not in (reader.fieldnames or [])]
        if absent:
            raise ProfileError(f"{path}: no column {', '.join(absent)}")
        found = list(reader)
    if not found:
        raise ProfileError(f"{path}: no rows")
    return found


def csv_number(row: dict[str, str], key: str, path: Path) -> float:
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise ProfileError(f"{path}: {key} = {row.get(key)!r} is not a number") from None


def _curves(path: Path, size_column: str) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for row in csv_rows(path, ("layer", size_column, "time_us")):
        size = csv_number(row, size_column, path)
        seconds = csv_number(row, "time_us", path) / 1e6
        out.setdefault(row["layer"], []).append((size, seconds))
    return out


def read_tables(tp_dir: Path) -> RawTables:
    if (tp_dir / "moe.csv").exists():
        raise ProfileError(
            f"{tp_dir}: has moe.csv (a mixture-of-experts model); the step model covers dense "
            "decoder models only"
        )
    attention_path = tp_dir / "attention.csv"
    columns = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
    attention = [
        (
            csv_number(row, "prefill_chunk", attention_path),
            csv_number(row, "kv_prefill", attention_path),
            csv_number(row, "n_decode", attention_path),
            csv_number(row, "kv_decode", attention_path),
            csv_number(row, "time_us", attention_path) / 1e6,
        )
        for row in csv_rows(attention_path, columns)
    ]
    return RawTables(
        dense=_curves(tp_dir / "dense.csv", "tokens"),
        per_sequence=_curves(tp_dir / "per_sequence.csv", "sequences"),
        attention=attention,
        skew=_skew(tp_dir / "skew.csv"),
    )


def _skew(path: Path) -> list[tuple[float, float, float, float]]:
    """The skewed-batch measurements, where the profile has them (none: no correction); ``pc``
    is the prefill chunk beside the decodes (0: decodes alone)."""
    if not path.is_file():
        return []
    columns = ("pc", "t_mean_us", "t_max_us", "t_skew_us")
    return [
        (
            csv_number(row, columns[0], path),
            csv_number(row, columns[1], path),
            csv_number(row, columns[2], path),
            csv_number(row, columns[3], path),
        )
        for row in csv_rows(path, columns)
    ]


CONFIG_DIRS = (("configs", "model"), ("model_config",))  # LLMServingSim today; its ISPASS'26 tag


def find_model_config(profile_dir: Path, model: str) -> Path:
    """Where the model's ``config.json`` is: ``config.json`` in the profile directory, else
    ``configs/model/<org>/<model>.json`` (or ``model_config/...``, as older LLMServingSim
    checkouts keep it) in the nearest directory above the profile that has one; or a
    ProfileError naming where it looked."""
    local = profile_dir / "config.json"
    if local.is_file():
        return local
    for folder in profile_dir.resolve().parents:
        for parts in CONFIG_DIRS:
            candidate = folder.joinpath(*parts, f"{model}.json")
            if candidate.is_file():
                return candidate
    raise ProfileError(
        f"no model config for {model}: no {local}, and no configs/model/{model}.json or "
        f"model_config/{model}.json above {profile_dir}; give one with --model-config"
    )


def read_model_config(path: Path) -> ModelConfig:
    try:
        hf = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as error:
        raise ProfileError(f"{path}: {error}") from None
    if not isinstance(hf, dict):
        raise ProfileError(f"{path}: not a JSON object")
    return ModelConfig.from_hf(hf, str(path))


def read_profile(profile_dir: Path, model_config: Path | None = None) -> SourceProfile:
    """Read an LLMServingSim profile directory (see the module docstring)."""
    import yaml  # the simulator's extra; only this importer reads YAML

    meta_path = profile_dir / "meta.yaml"
    if not meta_path.is_file():
        raise ProfileError(f"{meta_path}: missing (is {profile_dir} a profile directory?)")
    meta = yaml.safe_load(meta_path.read_text("utf-8"))
    if not isinstance(meta, dict):
        raise ProfileError(f"{meta_path}: not a mapping")
    missing = [key for key in ("model", "hardware", "tp_degrees") if key not in meta]
    if missing:
        raise ProfileError(f"{meta_path}: no {', '.join(missing)}")
    model = str(meta["model"])
    config_path = model_config or find_model_config(profile_dir, model)
    config = read_model_config(config_path)
    tables = {int(tp): read_tables(profile_dir / f"tp{int(tp)}") for tp in meta["tp_degrees"]}
    return SourceProfile(
        gpu=str(meta["hardware"]),
        gpu_name=str(meta.get("gpu", meta["hardware"])),
        model=model,
        dtype=str(meta.get("variant", profile_dir.name)),
        meta=meta,
        config=config,
        tables=tables,
    )
