"""Routing policies on reservations: least_reserved, round_robin, random, power_of_two; the
names the configuration accepts each build their policy."""

from __future__ import annotations

import random
from collections import Counter
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.config import RoutingPolicyName, RoutingSettings
from narwhal.core.routing.build import build_policy
from narwhal.core.routing.load import LoadReports
from narwhal.core.routing.policy import (
    Counts,
    LeastReserved,
    PowerOfTwo,
    RandomChoice,
    RoundRobin,
    RoutingPolicy,
    least_reserved,
)

URLS = ["http://e0", "http://e1", "http://e2", "http://e3"]


def counts(*loads: int, phase: str = "prefill") -> Counts:
    """Reservations of ``phase`` per engine (the first engines, as many as loads given)."""
    return {
        url: {"prefill": 0, "decode": 0, phase: load}
        for url, load in zip(URLS, loads, strict=False)
    }


def test_every_configured_name_builds_the_policy_of_that_name() -> None:
    names = get_args(RoutingPolicyName)
    assert set(names) == {
        "least_reserved",
        "round_robin",
        "random",
        "power_of_two",
        "least_loaded",
        "prefix_affinity",
        "kv_aware",
    }
    for name in names:
        policy = build_policy(
            name,
            "decode",
            serving=URLS,
            counts=counts(0, 0, 0, 0),
            rng=random.Random(0),
            reports=LoadReports(URLS),
            settings=RoutingSettings(),
            block_chain=lambda request: None,  # (kv_aware needs the engines' block identity)
        )
        assert isinstance(policy, RoutingPolicy) and policy.name == name
        assert policy.phase == "decode"
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'"):
        build_policy(
            "fastest",
            "decode",
            serving=URLS,
            counts=counts(0),
            rng=random.Random(0),
            reports=LoadReports(URLS),
            settings=RoutingSettings(),
        )


def test_least_reserved_takes_the_fewest_of_its_phase_only() -> None:
    c = counts(2, 1, 3, 1, phase="prefill")
    c["http://e1"]["decode"] = 9  # the other phase's reservations do not count
    policy = LeastReserved("prefill", c, random.Random(0))
    assert {policy.choose(URLS, None, 0.0) for _ in range(30)} == {"http://e1", "http://e3"}
    assert policy.choose(URLS[:3], None, 0.0) == "http://e1"  # only among the candidates


def test_least_reserved_draws_only_on_a_tie() -> None:
    rng = random.Random(5)
    state = rng.getstate()
    assert least_reserved(URLS, counts(1, 0, 1, 1), "prefill", rng) == "http://e1"
    assert rng.getstate() == state
    least_reserved(URLS, counts(0, 0, 1, 1), "prefill", rng)
    assert rng.getstate() != state


@settings(derandomize=True, max_examples=200)
@given(
    loads=st.lists(st.integers(0, 3), min_size=4, max_size=4),
    chosen=st.sets(st.sampled_from(URLS), min_size=1),
    seed=st.integers(0, 2**16),
)
def test_least_reserved_is_the_rule_written_out(
    loads: list[int], chosen: set[str], seed: int
) -> None:
    candidates = [u for u in URLS if u in chosen]
    c = counts(*loads)
    least = min(c[u]["prefill"] for u in candidates)
    tied = [u for u in candidates if c[u]["prefill"] == least]
    expected = tied[0] if len(tied) == 1 else random.Random(seed).choice(tied)
    assert least_reserved(candidates, c, "prefill", random.Random(seed)) == expected


def test_round_robin_cycles_in_config_order_and_skips_non_candidates() -> None:
    policy = RoundRobin("decode", counts(0, 0, 0, 0), random.Random(0), URLS)
    assert [policy.choose(URLS, None, 0.0) for _ in range(5)] == [
        "http://e0",
        "http://e1",
        "http://e2",
        "http://e3",
        "http://e0",
    ]
    # e1 is not a candidate now: the turn passes to the next one after the last chosen (e0)
    assert policy.choose(["http://e0", "http://e2", "http://e3"], None, 0.0) == "http://e2"
    assert policy.choose(["http://e0", "http://e1"], None, 0.0) == "http://e0"  # wraps round
    assert policy.choose(URLS, None, 0.0) == "http://e1"


def test_round_robin_ignores_reservations() -> None:
    policy = RoundRobin("decode", counts(9, 0, 0, 0, phase="decode"), random.Random(0), URLS)
    assert policy.choose(URLS, None, 0.0) == "http://e0"


def test_random_is_uniform_and_seeded() -> None:
    def picks(seed: int) -> list[str]:
        policy = RandomChoice("prefill", counts(9, 0, 0, 0), random.Random(seed))
        return [policy.choose(URLS, None, 0.0) for _ in range(4000)]

    assert picks(3) == picks(3) and picks(3) != picks(4)
    tally = Counter(picks(3))
    assert set(tally) == set(URLS)
    assert all(900 < n < 1100 for n in tally.values()), tally  # 1000 each; reservations ignored


def test_power_of_two_takes_the_less_reserved_of_two_drawn() -> None:
    c = counts(0, 1, 2, 3)
    policy = PowerOfTwo("prefill", c, random.Random(7))
    picks = Counter(policy.choose(URLS, None, 0.0) for _ in range(6000))
    # of the six pairs, each drawn alike: e0 wins the three it is in, e1 two, e2 one, e3 none
    assert "http://e3" not in picks
    assert picks["http://e0"] > picks["http://e1"] > picks["http://e2"] > 0
    assert abs(picks["http://e0"] / 6000 - 3 / 6) < 0.03
    assert abs(picks["http://e2"] / 6000 - 1 / 6) < 0.03


def test_power_of_two_replays_its_draws() -> None:
    rng = random.Random(11)
    first, second = rng.sample(URLS, 2)
    c = counts(1, 1, 1, 1)
    assert PowerOfTwo("prefill", c, random.Random(11)).choose(URLS, None, 0.0) == first  # tie
    c[first]["prefill"] = 2
    assert PowerOfTwo("prefill", c, random.Random(11)).choose(URLS, None, 0.0) == second


def test_one_candidate_is_taken_without_a_draw() -> None:
    for policy_type in (RandomChoice, PowerOfTwo, LeastReserved):
        rng = random.Random(2)
        state = rng.getstate()
        policy = policy_type("prefill", counts(5, 0, 0, 0), rng)
        assert policy.choose(["http://e0"], None, 0.0) == "http://e0"
        assert rng.getstate() == state
