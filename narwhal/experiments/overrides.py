"""Overrides: set dotted keys in a scenario mapping, and resolve the sweep's derived keys.

Rule kept here: an override only edits the plain mapping read from a scenario TOML; whether the
result is a valid scenario is decided by the simulator's parser, never here. A dotted key walks
tables by name and arrays by index (``faults.2.rate_per_hour``); a table value is merged into a
table, anything else replaces.

Derived keys are sweep conveniences translated into scenario keys, in this order:

- ``fleet.size`` and ``fleet.pd_ratio`` (``"P:D"``): prefill and decode counts with that total
  and ratio; ``prefill = size x P / (P + D)`` rounded half up, kept within ``1 .. size - 1``,
  ``decode = size - prefill``. Either alone keeps the other from the base fleet.
- ``workload.rate_multiplier``: multiplies the trace's ``rate_scale`` (a trace workload), the
  synthetic ``rate`` (poisson, gamma) or every stage's ``rate`` of a ``shared_context`` ramp
  (the simulator's default ramp when the scenario gives none).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from narwhal.sim.shared_context import LLMD_STAGES

SCENARIO_KEYS = (
    "name",
    "description",
    "engine",
    "recovery",
    "routing",
    "admission",
    "flow",
    "engine_contract",
    "engines",
    "fleet",
    "workload",
    "faults",
    "sim",
    "router",  # [router] replicas, spread (narwhal.sim.replicas)
)
_WORKLOAD_DEFAULTS = {"kind": "trace", "rate_scale": 1.0, "rate": 5.0}  # as WorkloadSettings


def flatten(mapping: dict[str, Any], *, stop_at_lists: bool = False) -> dict[str, Any]:
    """Nested tables as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); keys already
    dotted are kept. Lists are leaves (with ``stop_at_lists`` they are always axis values)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            for sub, leaf in flatten(value, stop_at_lists=stop_at_lists).items():
                out[f"{key}.{sub}"] = leaf
        else:
            out[key] = value
    return out


def check_key(key: str) -> str | None:
    """Why a dotted key cannot name a scenario setting, or None when it may."""
    parts = key.split(".")
    if any(not part for part in parts):
        return "empty part in the dotted key"
    if parts[0] not in SCENARIO_KEYS:
        return f"unknown scenario section {parts[0]!r} (one of {', '.join(SCENARIO_KEYS)})"
    return None


def _merge(into: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for key, item in value.items():
        if isinstance(item, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], item)
        else:
            out[key] = copy.deepcopy(item)
    return out


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set one dotted key in ``data`` (in place), creating tables on the way."""
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ValueError(f"{where}: no such array element (the array has {len(node)})")
            index = int(part)
            if last:
                node[index] = (
                    _merge(node[index], value)
                    if isinstance(value, dict) and isinstance(node[index], dict)
                    else copy.deepcopy(value)
                )
            else:
                node = node[index]
            continue
        if not isinstance(node, dict):
            raise ValueError(f"{where}: {'.'.join(parts[:depth])} is not a table")
        if last:
            current = node.get(part)
            node[part] = (
                _merge(current, value)
                if isinstance(value, dict) and isinstance(current, dict)
                else copy.deepcopy(value)
            )
        else:
            node = node.setdefault(part, {})


def parse_ratio(value: Any) -> tuple[float, float]:
    """``"P:D"`` as two positive numbers."""
    if isinstance(value, str) and value.count(":") == 1:
        left, right = value.split(":")
        try:
            p, d = float(left), float(right)
        except ValueError:
            p = d = -1.0
        if p > 0 and d > 0:
            return p, d
    raise ValueError(f'fleet.pd_ratio: {value!r} is not a ratio like "1:3"')


def _number(value: Any, key: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (positive and value <= 0):
        raise ValueError(f"{key}: must be a positive number, got {value!r}")
    return float(value)


def _count(fleet: dict[str, Any], role: str) -> int:
    value = fleet.get(role, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"fleet.{role}: must be a whole number of engines, got {value!r}")
    return int(value)


def _resolve_fleet(data: dict[str, Any]) -> None:
    fleet = data.get("fleet")
    if not isinstance(fleet, dict) or ("size" not in fleet and "pd_ratio" not in fleet):
        return
    size_raw, ratio_raw = fleet.pop("size", None), fleet.pop("pd_ratio", None)
    if "engines" in data:
        raise ValueError("fleet.size: the scenario lists [[engines]]; sizes need [fleet] counts")
    if fleet.get("both", 0):
        raise ValueError("fleet.size: derived sizes split prefill and decode; fleet.both is set")
    prefill, decode = _count(fleet, "prefill"), _count(fleet, "decode")
    if size_raw is None:
        size = prefill + decode
    elif isinstance(size_raw, bool) or not isinstance(size_raw, int):
        raise ValueError(f"fleet.size: must be a whole number of engines, got {size_raw!r}")
    else:
        size = size_raw
    if size < 2:
        raise ValueError(f"fleet.size: a prefill/decode fleet needs at least 2 engines, got {size}")
    if ratio_raw is None:
        if prefill <= 0 or decode <= 0:
            raise ValueError("fleet.size: the base fleet has no prefill:decode ratio to keep")
        p, d = float(prefill), float(decode)
    else:
        p, d = parse_ratio(ratio_raw)
    new_prefill = min(size - 1, max(1, math.floor(size * p / (p + d) + 0.5)))
    fleet["prefill"], fleet["decode"] = new_prefill, size - new_prefill


def _scale_stages(workload: dict[str, Any], multiplier: float) -> None:
    """Every stage of a shared-context ramp at ``multiplier`` times its rate."""
    settings = workload.setdefault("shared_context", {})
    if not isinstance(settings, dict):
        raise ValueError(f"workload.shared_context: must be a table, got {settings!r}")
    stages = settings.get("stages")
    if stages is None:
        stages = [{"rate": rate, "duration_s": duration} for rate, duration in LLMD_STAGES]
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise ValueError(
            f"workload.shared_context.stages: must be a list of tables, got {stages!r}"
        )
    scaled = []
    for i, stage in enumerate(stages):
        rate = _number(stage.get("rate"), f"workload.shared_context.stages.{i}.rate")
        scaled.append({**stage, "rate": rate * multiplier})
    settings["stages"] = scaled


def scale_rate(data: dict[str, Any], multiplier: float) -> None:
    """Multiply the workload's arrival rate: trace ``rate_scale``, synthetic ``rate``, every
    ``shared_context`` stage's ``rate``, or the ``fixed`` arrival times divided (as
    :func:`narwhal.sim.results.goodput_sweep` does)."""
    workload = data.setdefault("workload", {})
    if not isinstance(workload, dict):
        raise ValueError(f"workload: must be a table, got {workload!r}")
    kind = workload.get("kind", _WORKLOAD_DEFAULTS["kind"])
    if kind == "fixed":
        times = workload.get("arrivals_s")
        if isinstance(times, list) and all(
            isinstance(t, int | float) and not isinstance(t, bool) for t in times
        ):
            workload["arrivals_s"] = [t / multiplier for t in times]
        return  # anything else is refused when the scenario is parsed
    if kind == "shared_context":
        _scale_stages(workload, multiplier)
        return
    if kind == "log":
        raise ValueError(
            'workload.rate_multiplier: a kind = "log" workload replays the log\'s own arrival '
            "times; it has no rate to scale"
        )
    key = "rate_scale" if kind == "trace" else "rate"
    base = _number(workload.get(key, _WORKLOAD_DEFAULTS[key]), f"workload.{key}")
    workload[key] = base * multiplier


def resolve(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with the derived keys translated into scenario keys."""
    out = copy.deepcopy(data)
    _resolve_fleet(out)
    workload = out.get("workload")
    if isinstance(workload, dict) and "rate_multiplier" in workload:
        multiplier = _number(workload.pop("rate_multiplier"), "workload.rate_multiplier")
        scale_rate(out, multiplier)
    return out


def apply(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` with every dotted override set (derived keys still unresolved)."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        set_key(out, key, value)
    return out
