"""Helpers for the simulator tests: small scenarios built from dicts (real SimPy, seeded)."""

from __future__ import annotations

import copy
from typing import Any

from narwhal.sim.scenario import Scenario, parse_scenario

BASE: dict[str, Any] = {
    "name": "test",
    "engine": {
        "first_token_timeout_s": 1.0,
        "decode_read_timeout_s": 0.5,
        "request_timeout_s": 30.0,
        "max_handoff_age_s": 5.0,
    },
    "recovery": {"eject_after": 3, "max_attempts": 1, "probe_interval_s": 2.0},
    "fleet": {"prefill": 2, "decode": 2, "model": "llama3-8b", "jitter": 0.0},
    "workload": {
        "kind": "poisson",
        "rate": 20.0,
        "duration_s": 10.0,
        "prompt": {"dist": "fixed", "value": 200},
        "output": {"dist": "fixed", "value": 20},
    },
    "sim": {"seed": 3},
}


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def scenario(**extra: Any) -> Scenario:
    """The base test scenario with sections merged from ``extra``."""
    return parse_scenario(merge(BASE, extra), "test")
