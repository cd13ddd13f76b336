"""The shared-context workload: groups of users whose prompts share a long prefix, offered at a
rising rate — the shape of llm-d's published prefix-routing benchmark.

Rule kept here: the workload is a pure function of its settings and a seeded RNG, and every
prompt carries its content identity (:mod:`narwhal.sim.gpu.prefix`), so prefix caches and
prefix-aware routing see exactly the sharing the settings describe.

Theory of operation: there are ``groups`` system prompts of ``system_prompt_tokens`` tokens
(a tenant's long shared context) and ``users_per_group`` users in each group, each with a
question of ``question_tokens`` tokens; a user's prompt is the group's system prompt followed
by the user's question, as inference-perf's ``shared_prefix`` data builds it (llm-d's benchmark:
150 groups of 5 users, 6,000 + 1,200 tokens, 1,000 output tokens, the defaults here). Arrivals
are Poisson at each stage's ``rate`` for its ``duration_s``, stage after stage (the default
ladder is llm-d's: a 50 s warm-up at 15 req/s, then 3 up to 60 req/s); each request is from a
user drawn uniformly. ``unique_questions = true`` gives every request a question of its own
(only the system prompt is shared). Segment ids: group ``g`` is ``g``, user ``u`` of it
``groups + g * users_per_group + u``, a request's own question ``groups * (users_per_group + 1)
+ its number`` — distinct, and chained because a user belongs to one group.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from narwhal.sim.gpu.prefix import Segments

# llm-d's benchmark ladder (inference-perf stages): (rate in req/s, duration in s)
LLMD_STAGES = (
    (15.0, 50.0),
    (3.0, 20.0),
    (10.0, 20.0),
    (15.0, 20.0),
    (20.0, 38.0),
    (22.0, 34.0),
    (25.0, 30.0),
    (30.0, 25.0),
    (35.0, 21.0),
    (40.0, 38.0),
    (43.0, 36.0),
    (46.0, 33.0),
    (49.0, 30.0),
    (52.0, 29.0),
    (55.0, 27.0),
    (57.0, 26.0),
    (60.0, 25.0),
)


class RateStage(BaseModel):
    """One stage of the ramp: Poisson arrivals at ``rate`` for ``duration_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(gt=0)
    duration_s: float = Field(gt=0)


class SharedContextSettings(BaseModel):
    """``[workload.shared_context]``: the groups, users, lengths and the rate ramp."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: int = Field(150, ge=1)
    users_per_group: int = Field(5, ge=1)
    system_prompt_tokens: int = Field(6000, ge=16)
    question_tokens: int = Field(1200, ge=1)
    output_tokens: int = Field(1000, ge=1)
    unique_questions: bool = False  # true: each request asks its own question
    stages: tuple[RateStage, ...] = Field(
        default=tuple(RateStage(rate=r, duration_s=d) for r, d in LLMD_STAGES), min_length=1
    )

    def scaled(self, factor: float) -> SharedContextSettings:
        """The same ramp with every stage's rate multiplied by ``factor``."""
        stages = tuple(s.model_copy(update={"rate": s.rate * factor}) for s in self.stages)
        return self.model_copy(update={"stages": stages})


def shared_context_arrivals(
    settings: SharedContextSettings, rng: random.Random
) -> Iterator[tuple[float, int, int, Segments]]:
    """``(time, prompt tokens, output tokens, segments)`` of every request, in time order."""
    groups, users = settings.groups, settings.users_per_group
    system, question = settings.system_prompt_tokens, settings.question_tokens
    prompt = system + question
    own_question_base = groups * (users + 1)
    number = 0
    begin = 0.0
    for stage in settings.stages:
        end = begin + stage.duration_s
        t = begin
        while True:
            t += rng.expovariate(stage.rate)
            if t >= end:
                break
            user = rng.randrange(groups * users)
            group = user // users
            asker = own_question_base + number if settings.unique_questions else groups + user
            yield t, prompt, settings.output_tokens, ((group, system), (asker, question))
            number += 1
        begin = end
