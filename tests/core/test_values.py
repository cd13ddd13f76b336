"""The value classes that write their own ``__init__`` (for the compiled build's speed) keep the
dataclass contract: the fields as parameters, in order, with their defaults and nothing else,
every field set, frozen where declared frozen, equal and hashed by value. Run against both builds
(CI runs the suite on the compiled one too)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from narwhal.core.breaker import Breaker
from narwhal.core.config import RecoverySettings, Role
from narwhal.core.placement import Placement, Reservation
from narwhal.core.ports import Burst, Chunk, Reply, StreamOpened
from narwhal.core.records import DecisionLog
from narwhal.core.request_record import RequestRecord
from narwhal.core.requests import ClientRequest
from narwhal.core.retry import Deadline
from narwhal.core.sse import EventKind, SseEvent

FROZEN = [Reply, StreamOpened, Chunk, Burst, ClientRequest, Deadline, SseEvent, RequestRecord]
SAMPLES: dict[str, Any] = {
    "status": 503,
    "body": b"{}",
    "headers": (("retry-after", "1"),),
    "handle": object(),
    "data": b"data: x\n\n",
    "reads": ((1.5, b"a"), (2.5, b"b")),
    "request_id": "req-1",
    "endpoint": "/v1/completions",
    "arrival": 3.25,
    "at": 7.5,
    "kind": EventKind.ERROR,
    "payload": {"error": {"code": 503}},
    "error_status": 503,
    "error_message": "overloaded",
    "encoded": b"data: {}\n\n",
    "url": "http://e",
    "phase": "decode",
    "epoch": 2,
    "_placement": Placement(
        {"http://e": Role.DECODE},
        Breaker([("http://e", Role.DECODE)], RecoverySettings(), random.Random(0), DecisionLog()),
        random.Random(0),
        DecisionLog(),
    ),
    "released": True,
    "outcome": "inband_error",
    "committed": True,
    "ttft_s": 0.25,
    "first_byte_s": 0.5,
    "finished_s": 1.75,
    "attempts": 2,
    "engines": ("http://p", "http://d"),
    "output_tokens": 7,
    "error": "engine error in stream",
}


def sample(cls: type, name: str) -> Any:
    if cls is SseEvent and name == "data":
        return '{"error": {"code": 503}}'  # an event's data is text
    if cls is ClientRequest and name == "body":
        return {"prompt": "x"}
    if cls is RequestRecord and name == "request_id":
        return "req-9"
    return SAMPLES[name]


@pytest.mark.parametrize("cls", [*FROZEN, Reservation], ids=lambda cls: cls.__name__)
def test_every_field_is_set_positionally_and_by_keyword(cls: type) -> None:
    # (positionally in field order, by keyword, with the fields' defaults: the signature the
    # dataclass would have generated; a compiled __init__ has no inspectable signature)
    values = {f.name: sample(cls, f.name) for f in dataclasses.fields(cls)}
    for value in (cls(*values.values()), cls(**values)):
        assert {name: getattr(value, name) for name in values} == values
    with pytest.raises(TypeError):
        cls(*values.values(), None)  # no parameter beyond the fields
    with pytest.raises(TypeError):
        cls(**values, unknown=None)
    required = {f.name: values[f.name] for f in dataclasses.fields(cls) if not _has_default(f)}
    defaulted = cls(**required)
    for f in dataclasses.fields(cls):
        if _has_default(f):
            assert getattr(defaulted, f.name) == f.default


@pytest.mark.parametrize("cls", FROZEN, ids=lambda cls: cls.__name__)
def test_frozen_values_stay_frozen_and_compare_by_value(cls: type) -> None:
    values = {f.name: sample(cls, f.name) for f in dataclasses.fields(cls)}
    value = cls(**values)
    name = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, values[name])
    assert value == cls(**values)
    if cls not in (ClientRequest,):  # a request holds its body (a dict): not hashable
        assert hash(value) == hash(cls(**values))


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING
