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


def producers(name: str, seed: int = 3) -> list[str]:
    result = run(
        scenario(routing={"prefill": name, "decode": name}, workload=SHORT, sim={"seed": seed})
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


def test_prefix_affinity_keeps_a_shared_prompt_on_one_engine() -> None:
    # every prompt of this workload is the same: within the load guard, the engine that has it
    affinity = Counter(producers("prefix_affinity"))
    assert affinity.most_common(1)[0][1] == sum(affinity.values())
