"""The shared-context workload: groups sharing a system prompt, users with their questions,
Poisson arrivals stage by stage; seeded."""

from __future__ import annotations

import itertools
import random

import pytest
from pydantic import ValidationError

from narwhal.sim.shared_context import LLMD_STAGES, SharedContextSettings
from narwhal.sim.workload import Arrival, WorkloadSettings, generate

SMALL = SharedContextSettings(
    groups=3,
    users_per_group=4,
    system_prompt_tokens=600,
    question_tokens=50,
    output_tokens=9,
    stages=({"rate": 40.0, "duration_s": 50.0}, {"rate": 200.0, "duration_s": 10.0}),
)


def arrivals(settings: SharedContextSettings, seed: int = 1) -> list[Arrival]:
    workload = WorkloadSettings(kind="shared_context", shared_context=settings)
    return generate(workload, random.Random(seed))


def test_each_prompt_is_its_groups_system_prompt_then_its_users_question() -> None:
    got = arrivals(SMALL)
    assert all(a.prompt == 650 and a.output == 9 for a in got)
    for a in got:
        (group, system), (user, question) = a.prefix
        assert (system, question) == (600, 50) and 0 <= group < 3
        assert user - 3 in range(group * 4, group * 4 + 4)  # a user of that group
    users = {a.prefix[1][0] for a in got}
    assert len(users) == 12  # every user asks (uniformly drawn)
    assert arrivals(SMALL) == got and arrivals(SMALL, seed=2) != got  # seeded


def test_arrivals_follow_the_stages_rates() -> None:
    got = arrivals(SMALL)
    assert all(b.t >= a.t for a, b in itertools.pairwise(got))
    first = [a for a in got if a.t < 50.0]
    second = [a for a in got if a.t >= 50.0]
    assert 1800 < len(first) < 2200 and 1800 < len(second) < 2200  # 40 x 50 and 200 x 10
    assert got[-1].t < 60.0
    doubled = arrivals(SMALL.scaled(2.0))
    assert 3700 < sum(1 for a in doubled if a.t < 50.0) < 4300


def test_unique_questions_share_only_the_system_prompt() -> None:
    got = arrivals(SMALL.model_copy(update={"unique_questions": True}))
    questions = [a.prefix[1][0] for a in got]
    assert len(set(questions)) == len(got)
    assert min(questions) >= 3 * (4 + 1)  # apart from every group's and user's id


def test_the_defaults_are_llm_ds_benchmark_shape() -> None:
    default = SharedContextSettings()
    assert (default.groups, default.users_per_group) == (150, 5)
    assert (default.system_prompt_tokens, default.question_tokens) == (6000, 1200)
    assert default.output_tokens == 1000
    assert [(s.rate, s.duration_s) for s in default.stages] == list(LLMD_STAGES)


def test_the_workload_section_is_checked() -> None:
    with pytest.raises(ValidationError, match="takes its lengths from"):
        WorkloadSettings(kind="shared_context", prompt={"value": 5}, output={"value": 5})
    with pytest.raises(ValidationError, match='needs kind = "shared_context"'):
        WorkloadSettings(kind="poisson", duration_s=5.0, shared_context=SMALL)
    with pytest.raises(ValidationError, match="stages"):
        SharedContextSettings(stages=())
    with pytest.raises(ValidationError, match="greater than 0"):
        SharedContextSettings(stages=({"rate": 0.0, "duration_s": 1.0},))
