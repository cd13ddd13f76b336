"""The decision log: decisions equal by their values, kept in order with sorted details,
nothing kept when disabled, an observer called on each decision, and a bounded memory; request
records equal by what they say."""

from __future__ import annotations

from narwhal.core.records import Decision, DecisionLog, RequestRecord


def test_decisions_are_kept_in_order_with_sorted_details() -> None:
    log = DecisionLog()
    log.add(1.0, "place", "http://e", phase="decode", request="r1")
    log.add(2.0, "status", None, status=200)
    assert log.entries == [
        Decision(1.0, "place", "http://e", (("phase", "decode"), ("request", "r1"))),
        Decision(2.0, "status", None, (("status", 200),)),
    ]
    assert log.entries[0].as_dict() == {
        "t": 1.0,
        "kind": "place",
        "engine": "http://e",
        "phase": "decode",
        "request": "r1",
    }


def test_decisions_are_equal_and_hashed_by_all_four_values() -> None:
    one = Decision(1.0, "place", "http://e", (("phase", "decode"),))
    assert one == Decision(1.0, "place", "http://e", (("phase", "decode"),))
    assert hash(one) == hash(Decision(1.0, "place", "http://e", (("phase", "decode"),)))
    others = [
        Decision(2.0, "place", "http://e", (("phase", "decode"),)),
        Decision(1.0, "eject", "http://e", (("phase", "decode"),)),
        Decision(1.0, "place", None, (("phase", "decode"),)),
        Decision(1.0, "place", "http://e", (("phase", "prefill"),)),
    ]
    assert all(one != other for other in others)
    assert len({one, *others}) == 5
    assert one != (1.0, "place", "http://e", (("phase", "decode"),))
    assert repr(one) == (
        "Decision(t=1.0, kind='place', engine='http://e', detail=(('phase', 'decode'),))"
    )


def test_a_disabled_log_keeps_and_reports_nothing() -> None:
    seen: list[Decision] = []
    log = DecisionLog(enabled=False, on_decision=seen.append)
    log.add(1.0, "eject", "http://e")
    assert log.entries == [] and seen == []


def test_the_observer_sees_every_decision_and_the_memory_stays_bounded() -> None:
    seen: list[Decision] = []
    log = DecisionLog(on_decision=seen.append, keep=3)
    for t in range(10):
        log.add(float(t), "probe", "http://e")
    assert [d.t for d in seen] == [float(t) for t in range(10)]
    assert 3 <= len(log.entries) <= 6
    assert [d.t for d in log.entries] == [float(t) for t in range(10 - len(log.entries), 10)]


def record(**changes: object) -> RequestRecord:
    fields: dict[str, object] = {
        "request_id": "req-1",
        "arrival": 1.0,
        "status": 200,
        "outcome": "ok",
        "committed": True,
        "ttft_s": 0.1,
        "first_byte_s": 0.2,
        "finished_s": 0.5,
        "attempts": 1,
        "engines": ("http://p", "http://d"),
        "output_tokens": 3,
    }
    return RequestRecord(**{**fields, **changes})  # type: ignore[arg-type]


def test_records_are_equal_when_they_say_the_same() -> None:
    assert record() == record() and record() != record(attempts=2)
    assert record(error="x") != record() and record() != record().as_dict()
    assert record().as_dict()["engines"] == ["http://p", "http://d"]
    assert record().as_dict()["error"] is None  # the default
    assert repr(record()).startswith("RequestRecord(request_id='req-1', arrival=1.0, ")
