"""Fault scripts of the emulator: the shared vocabulary's names and parameters, nothing else."""

from __future__ import annotations

import random
from typing import Any

import pytest

from narwhal.core.injected_faults import BY_NAME, EMULATOR, RENAMED, names_in
from narwhal.emulator.faults import (
    ENGINE_KINDS,
    REQUEST_KINDS,
    TRIGGERS,
    FaultBook,
    FaultError,
    FaultSpec,
    parse_fault,
)


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_an_old_name_is_refused_naming_the_new_one(old: str, new: str) -> None:
    with pytest.raises(FaultError, match=f"'{old}' is now called '{new}'"):
        parse_fault(old)
    with pytest.raises(FaultError, match=f"'{old}' is now called '{new}'"):
        FaultSpec.from_dict({"kind": old})


def test_the_old_after_is_refused_naming_after_tokens() -> None:
    with pytest.raises(FaultError, match="'after' is now called 'after_tokens'"):
        parse_fault("stall:after=3")
    assert parse_fault("stall:after_tokens=3,count=2") == FaultSpec("stall", 2, after_tokens=3)


def test_a_simulator_only_fault_is_refused_naming_the_simulator() -> None:
    with pytest.raises(FaultError, match="'crash' is acted out by the simulator only"):
        parse_fault("crash")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http_5xx:code=404", "from 500 to 599, got 404"),
        ("stall:code=503", "'code' does not apply to 'stall'"),
        ("reset:seconds=2", "it takes no parameters"),
        ("slow:phase=middle", "phase must be one of"),
        ("slow:count=0", "count must be >= 1"),
        ("stall:after_tokens=-1", "must be >= 0"),
        ("stall:after_tokens", "is not key=value"),
        ("stall:speed=2", "unknown fault keys"),
        ("http_5xx:probability=0", "probability must be in"),
        ("http_5xx:probability=1.5", "probability must be in"),
        ("http_5xx:probability=nan", "probability must be in"),
        ("hang:probability=0.5", "'hang' switches the whole engine"),
        ("refused:probability=0.5", "'refused' switches the whole engine"),
    ],
)
def test_a_spec_it_cannot_use_is_refused(text: str, message: str) -> None:
    with pytest.raises(FaultError, match=message):
        parse_fault(text)


@pytest.mark.parametrize("name", sorted(names_in(EMULATOR)))
def test_every_fault_round_trips_through_its_dict(name: str) -> None:
    spec = FaultSpec(name)
    data = spec.as_dict()
    assert set(data) == {"kind", *TRIGGERS[1:], *BY_NAME[name].parameters[EMULATOR]}
    assert FaultSpec.from_dict(data) == spec


def test_a_fault_of_one_leg_defaults_to_its_phase() -> None:
    assert FaultSpec("kv_transfer_fail").phase == "decode"
    assert FaultSpec("release_handoff").phase == "prefill"
    assert FaultSpec("bad_descriptor").phase == "prefill"
    assert FaultSpec("stall").phase == "any"


def test_engine_wide_and_per_request_faults_split_the_vocabulary() -> None:
    assert names_in(EMULATOR) == ENGINE_KINDS | REQUEST_KINDS
    with pytest.raises(FaultError, match="engine-wide"):
        FaultBook().add(FaultSpec("hang"))


def test_the_book_takes_the_first_matching_fault_and_uses_up_its_count() -> None:
    book = FaultBook()
    book.add(FaultSpec("bad_descriptor", count=1))
    book.add(FaultSpec("kv_transfer_fail"))
    book.add(FaultSpec("stall", count=2))
    taken: list[Any] = [book.take("decode") for _ in range(3)]
    assert [s.kind if s else None for s in taken] == ["stall", "stall", None]
    pulled = book.take("decode", pulling=True)
    assert pulled is not None and pulled.kind == "kv_transfer_fail"  # waits for a pull
    first = book.take("prefill")
    assert first is not None and first.kind == "bad_descriptor"
    assert book.take("prefill") is None
    assert [s["kind"] for s in book.snapshot()] == ["kv_transfer_fail"]


def test_a_probability_is_parsed_and_shown() -> None:
    spec = parse_fault("http_5xx:probability=0.05,code=503")
    assert spec == FaultSpec("http_5xx", probability=0.05, code=503)
    assert spec.as_dict()["probability"] == 0.05
    assert FaultSpec.from_dict({"kind": "stall", "probability": "0.25"}).probability == 0.25


def strikes(book: FaultBook, n: int, phase: str = "decode") -> list[str | None]:
    return [s.kind if (s := book.take(phase)) else None for _ in range(n)]


def test_faults_with_probabilities_take_their_slices_of_one_draw() -> None:
    book = FaultBook(random.Random(7))
    book.add(FaultSpec("http_5xx", probability=0.02))
    book.add(FaultSpec("stall", probability=0.03))
    drawn = strikes(book, 20_000)
    # each fault strikes its own share (binomial sd about 20 and 24 requests)
    assert 300 <= drawn.count("http_5xx") <= 500
    assert 480 <= drawn.count("stall") <= 720
    assert drawn.count(None) == 20_000 - drawn.count("http_5xx") - drawn.count("stall")


def test_a_fault_without_a_probability_takes_what_the_others_leave() -> None:
    book = FaultBook(random.Random(7))
    book.add(FaultSpec("http_5xx", probability=0.1))
    book.add(FaultSpec("early_done"))
    drawn = strikes(book, 5_000)
    assert None not in drawn
    assert 400 <= drawn.count("http_5xx") <= 600


def test_the_same_seed_strikes_the_same_requests() -> None:
    def pattern(seed: int) -> list[str | None]:
        book = FaultBook(random.Random(seed))
        book.add(FaultSpec("inband_error", probability=0.3))
        return strikes(book, 200)

    assert pattern(3) == pattern(3)
    assert pattern(3) != pattern(4)


def test_a_count_is_used_up_only_by_requests_it_strikes() -> None:
    book = FaultBook(random.Random(1))
    book.add(FaultSpec("stall", count=3, probability=0.2))
    drawn = strikes(book, 200)
    assert drawn.count("stall") == 3
    assert drawn[:3] != ["stall"] * 3  # struck requests, not simply the first three
    assert book.snapshot() == []


def test_a_fault_of_the_other_phase_takes_no_slice() -> None:
    book = FaultBook(random.Random(2))
    book.add(FaultSpec("bad_descriptor", probability=0.5))  # prefill legs only
    book.add(FaultSpec("stall", probability=0.5))
    decodes = strikes(book, 2_000, "decode")
    assert set(decodes) == {"stall", None}
    assert 900 <= decodes.count("stall") <= 1_100  # its own 50%, not the second half
