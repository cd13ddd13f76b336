"""Policies: one seed gives every policy its own RNG; backend request ids are seeded."""

from __future__ import annotations

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
