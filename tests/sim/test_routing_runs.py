"""Routing policies end to end in the simulator: a scenario's ``[routing]`` reaches placement,
every policy serves the whole workload, and runs replay per seed."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import get_args

import pytest

from narwhal.core.config import RoutingPolicyName
from narwhal.sim.runner import run

from .conftest import scenario

SHORT = {"duration_s": 3.0}


def producers(name: str, seed: int = 3, workload: dict[str, object] = SHORT) -> list[str]:
    result = run(
        scenario(routing={"prefill": name, "decode": name}, workload=workload, sim={"seed": seed})
    )
    assert result.records and all(r.status == 200 for r in result.records), name
    return [r.engines[0] for r in sorted(result.records, key=lambda r: r.arrival)]


@pytest.mark.parametrize("name", get_args(RoutingPolicyName))
def test_every_policy_serves_the_workload_and_replays(name: str) -> None:
    assert producers(name) == producers(name)


def test_the_scenario_routing_decides_the_placements() -> None:
    turns = producers("round_robin")  # alternates between the two producers
    assert all(a != b for a, b in pairwise(turns))
    assert turns != producers("least_reserved") and len(set(producers("random"))) == 2


# one group of one user: every prompt is the same (the base workload's prompts share nothing)
ONE_PROMPT = {
    "kind": "shared_context",
    "prompt": None,
    "output": None,
    "duration_s": None,
    "shared_context": {
        "groups": 1,
        "users_per_group": 1,
        "system_prompt_tokens": 184,
        "question_tokens": 16,
        "output_tokens": 20,
        "stages": [{"rate": 20.0, "duration_s": 3.0}],
    },
}


def test_prefix_affinity_keeps_a_shared_prompt_on_one_engine() -> None:
    # within the load guard, the engine that has the prompt gets it again
    affinity = Counter(producers("prefix_affinity", workload=ONE_PROMPT))
    assert affinity.most_common(1)[0][1] == sum(affinity.values())
    spread = Counter(producers("least_reserved", workload=ONE_PROMPT))
    assert len(spread) == 2  # without affinity the same prompt goes to both producers
