"""Admission at its boundaries: exactly ``max_requests_in_flight`` slots, a refusal logged with
the request id, every slot given back once; and the ``[admission]`` keys refused when bad."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.admission import REFUSED, Admission
from narwhal.core.config import AdmissionSettings, ConfigError, parse_config
from narwhal.core.records import DecisionLog

ENGINES = [{"url": "http://p", "role": "prefill"}, {"url": "http://d", "role": "decode"}]


def admission(limit: int) -> tuple[Admission, DecisionLog]:
    log = DecisionLog()
    return Admission(AdmissionSettings(max_requests_in_flight=limit), log), log


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_exactly_limit_slots_then_refusals(limit: int) -> None:
    gate, log = admission(limit)
    assert [gate.try_admit(0.0, f"r{i}") for i in range(limit)] == [True] * limit
    assert log.entries == []
    assert not gate.try_admit(1.5, "late")
    assert gate.in_flight == limit and gate.refused == 1
    [refusal] = log.entries
    assert (refusal.t, refusal.kind, refusal.engine) == (1.5, REFUSED, None)
    assert dict(refusal.detail) == {"request": "late", "in_flight": limit}
    gate.release()  # one slot back: exactly one more is admitted
    assert gate.try_admit(2.0, "next") and not gate.try_admit(2.0, "again")
    assert gate.refused == 2


def test_every_slot_comes_back_and_no_more() -> None:
    gate, _ = admission(3)
    for i in range(3):
        assert gate.try_admit(0.0, f"r{i}")
    for _ in range(3):
        gate.release()
    assert gate.in_flight == 0
    with pytest.raises(RuntimeError, match="released more often than admitted"):
        gate.release()
    assert gate.in_flight == 0


def test_the_message_names_the_key_and_the_wait() -> None:
    gate = Admission(AdmissionSettings(max_requests_in_flight=7, retry_after_s=3), DecisionLog())
    assert gate.message() == (
        "the router is at its limit of 7 requests in flight "
        "(admission.max_requests_in_flight); retry after 3 s"
    )


def test_defaults() -> None:
    config = parse_config({"engines": ENGINES}).admission
    assert config.max_requests_in_flight == 512
    assert config.retry_after_s == 1
    assert config.max_body_bytes == 4 * 1024 * 1024
    assert config.max_json_values == 262_144


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("max_requests_in_flight", 0, "greater than or equal to 1"),
        ("max_requests_in_flight", True, "valid integer"),
        ("max_requests_in_flight", 4.0, "valid integer"),
        ("max_requests_in_flight", "64", "valid integer"),
        ("retry_after_s", 0, "greater than or equal to 1"),
        ("retry_after_s", 0.5, "valid integer"),
        ("retry_after_s", 3601, "less than or equal to 3600"),
        ("max_body_bytes", 100, "greater than or equal to 256"),
        ("max_json_values", 10**9, "less than or equal to 100000000"),
        ("max_in_flight", 4, "unknown key"),
    ],
)
def test_bad_keys_are_refused_by_name(key: str, value: Any, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"admission": {key: value}, "engines": ENGINES})
    assert f"admission.{key}: " in str(caught.value) and reason in str(caught.value)
