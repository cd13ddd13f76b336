"""Per-request disaggregation, the pure part: the router's prompt length estimate, the
remote_prefill_min_tokens boundary, and what prefix_affinity's index takes off."""

from __future__ import annotations

import random
from typing import Any

import pytest

from narwhal.core.breaker import Breaker
from narwhal.core.config import Role, RoutingSettings, parse_config
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog
from narwhal.core.requests import CHAT, COMPLETIONS, ClientRequest
from narwhal.core.routing.disagg import estimated_prompt_tokens
from narwhal.core.routing.prefix import PrefixAffinity, rendered_prompt

P0, D0, D1 = "http://p0", "http://d0", "http://d1"
ROLES = {P0: Role.PREFILL, D0: Role.DECODE, D1: Role.DECODE}


def completion(prompt: Any) -> ClientRequest:
    return ClientRequest("r", COMPLETIONS, {"prompt": prompt}, 0.0)


def placement(**routing: Any) -> Placement:
    settings = RoutingSettings.model_validate(routing)
    config = parse_config({"engines": [{"url": u, "role": r.value} for u, r in ROLES.items()]})
    log = DecisionLog()
    breaker = Breaker(ROLES.items(), config.recovery, random.Random(0), log)
    return Placement(ROLES, breaker, random.Random(1), log, settings)


def test_the_estimate_counts_token_ids_or_the_bytes_of_the_rendered_prompt() -> None:
    assert estimated_prompt_tokens(completion("x" * 37)) == 37
    assert estimated_prompt_tokens(completion("é" * 10)) == 20  # UTF-8 bytes: never fewer
    assert estimated_prompt_tokens(completion([5, 6, 7])) == 3
    assert estimated_prompt_tokens(completion([[5, 6, 7, 8]])) == 4  # a batch of one
    assert estimated_prompt_tokens(completion(["abcd"])) == 4
    chat = ClientRequest("r", CHAT, {"messages": [{"role": "user", "content": "hi"}]}, 0.0)
    assert estimated_prompt_tokens(chat) == len(rendered_prompt(chat))
    assert estimated_prompt_tokens(chat) == len('{"content":"hi","role":"user"}')


@pytest.mark.parametrize(
    ("prompt", "local"),
    [("x" * 9, True), ("x" * 10, False), ("x" * 50, False), ([1] * 9, True), ([1] * 10, False)],
)
def test_a_prompt_strictly_below_the_minimum_is_prefilled_locally(prompt: Any, local: bool) -> None:
    short = placement(remote_prefill_min_tokens=10)
    assert short.prefill_locally(completion(prompt), 0.0, ()) is local


def test_zero_means_every_prompt_is_prefilled_remotely() -> None:
    default = placement()
    assert default.prefill_locally(completion([1]), 0.0, ()) is False
    assert default.disaggregation.min_remote_tokens == 0
    assert default.local_without_producer is False
    assert placement(no_producer="local").local_without_producer is True


def prefix_placement(threshold: int = 8) -> tuple[Placement, PrefixAffinity]:
    p = placement(
        decode="prefix_affinity",
        remote_prefill_min_tokens=10,
        prefix_affinity={"block_size": 4, "imbalance_threshold": threshold},
    )
    policy = p.routing["decode"]
    assert isinstance(policy, PrefixAffinity)
    return p, policy


def test_what_the_chosen_consumer_holds_is_not_counted_as_uncached() -> None:
    p, _policy = prefix_placement()
    seen = completion("a" * 32)
    assert p.prefill_locally(seen, 0.0, ()) is False  # 32 uncached bytes
    assert p.choose("decode", 0.0, (), seen) in (D0, D1)  # the index now has its 8 blocks
    longer = completion("a" * 32 + "b" * 9)
    assert p.disaggregation.uncached_tokens(longer, [D0, D1]) == 9
    assert p.prefill_locally(longer, 0.0, ()) is True
    assert p.prefill_locally(completion("a" * 32 + "b" * 10), 0.0, ()) is False


def test_the_estimate_leaves_the_index_and_the_rng_untouched() -> None:
    p, policy = prefix_placement()
    p.choose("decode", 0.0, (), completion("a" * 32))
    before = ({url: len(i) for url, i in policy.indexes.items()}, policy.hits, policy.misses)
    state = p.routing["decode"]._rng.getstate()
    p.prefill_locally(completion("a" * 36), 0.0, ())
    assert (
        {url: len(i) for url, i in policy.indexes.items()},
        policy.hits,
        policy.misses,
    ) == before
    assert p.routing["decode"]._rng.getstate() == state


def test_a_match_the_load_guard_would_override_counts_as_uncached() -> None:
    p, _policy = prefix_placement(threshold=1)
    seen = completion("a" * 32)
    holder = p.choose("decode", 0.0, (), seen)
    other = D1 if holder == D0 else D0
    longer = completion("a" * 32 + "b")
    p.counts[holder]["decode"] = 2  # two more than the other consumer: over the guard
    assert p.disaggregation.uncached_tokens(longer, [D0, D1]) == 33
    p.counts[other]["decode"] = 1  # one more: within it
    assert p.disaggregation.uncached_tokens(longer, [D0, D1]) == 1


def test_consumers_this_request_failed_on_are_not_asked_while_others_serve() -> None:
    p, _ = prefix_placement()
    seen = completion("a" * 32)
    holder = p.choose("decode", 0.0, (), seen)
    longer = completion("a" * 32 + "b")
    assert p.prefill_locally(longer, 0.0, avoid=(holder,)) is False
    assert p.prefill_locally(longer, 0.0, avoid=(D0, D1)) is True  # none left: all of them


def test_a_tokenized_prompt_takes_off_the_held_share() -> None:
    p, policy = prefix_placement()
    ids = list(range(100, 120))  # 20 ids, rendered as "[100,101,...,119]" (81 bytes)
    p.choose("decode", 0.0, (), completion(ids[:18]))
    request = completion(ids)
    held = policy.held_blocks([D0, D1], request) * 4
    rendered = len(rendered_prompt(request))
    assert (held, rendered) == (72, 81)  # the 18 ids recorded, less the closing bracket
    assert p.disaggregation.uncached_tokens(request, [D0, D1]) == 20 - 20 * 72 // 81
