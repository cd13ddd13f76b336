"""Policies: one seed gives every policy its own RNG; backend request ids are seeded."""

from __future__ import annotations

import random
import re

from narwhal.core.config import parse_config
from narwhal.core.policies import Policies

CONFIG = parse_config({"engines": [{"url": "http://both", "role": "both"}]})


def test_backend_ids_are_the_prefix_and_twelve_hex_digits_from_the_seed() -> None:
    ids = [Policies(CONFIG, seed=7).new_id(f"req-{i}") for i in range(3)]
    assert ids == [Policies(CONFIG, seed=7).new_id(f"req-{i}") for i in range(3)]
    policies = Policies(CONFIG, seed=7)
    many = [policies.new_id("req") for _ in range(2000)]
    assert all(re.fullmatch(r"req-[0-9a-f]{12}", i) for i in many)
    assert any(i[4] == "0" for i in many)  # leading zeros are kept (1 in 16 ids)
    assert len(set(many)) == len(many)


def test_a_backend_id_is_the_next_48_bits_of_the_id_rng_in_hex() -> None:
    root = random.Random(7)
    root.getrandbits(64)  # the breaker's RNG
    root.getrandbits(64)  # the placement's RNG
    ids = random.Random(root.getrandbits(64))
    expected = [f"req-{ids.getrandbits(48):012x}" for _ in range(50)]
    policies = Policies(CONFIG, seed=7)
    assert [policies.new_id("req") for _ in range(50)] == expected
