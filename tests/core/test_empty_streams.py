"""Empty streams ([DONE] before any token): charged to the consumer only when another engine
answers the same request with a token; avoided by the request's retry in every case.

One :class:`EmptyStreams` against a real :class:`Breaker` (injected time, exact boundaries),
then through the lifecycle with scripted engines, then a five-consumer fleet with three bad
consumers where the third to reach ``eject_after`` is CAPPED and gets no traffic while a
healthy consumer is ready.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from narwhal.core.breaker import Breaker, EngineState, ProbeOutcome
from narwhal.core.config import RecoverySettings, Role, parse_config
from narwhal.core.empty_streams import EmptyStreams
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.records import DecisionLog
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    DONE,
    Decode,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
    token,
)

P0 = "http://p0"
A, B, C = "http://a", "http://b", "http://c"
EMPTY = Decode(items=((0.01, DONE),))  # [DONE] before any token
ANSWER = Decode(items=((0.01, token("A")), (0.01, token("B")), (0.0, DONE)))


def breaker(eject_after: int = 2, urls: tuple[str, ...] = (A, B, C)) -> Breaker:
    return Breaker(
        [(url, Role.DECODE) for url in urls],
        RecoverySettings(eject_after=eject_after, max_ejection_percent=100),
        random.Random(0),
        DecisionLog(),
    )


def charged_in(log: DecisionLog) -> list[str | None]:
    return [d.engine for d in log.entries if d.kind == "empty_stream_charged"]


def charged(b: Breaker) -> list[str | None]:
    return charged_in(b._log)


# ---------------------------------------------------------------------- one object, one breaker


def test_an_empty_stream_is_charged_when_another_engine_answers() -> None:
    b = breaker()
    empties = EmptyStreams("r1")
    empties.ended_empty(A, b.epoch(A), P0)
    assert b.health(A).decode_streak == 0, "nothing is charged before the evidence"
    empties.answered(B, 1.0, b, b._log)
    assert b.health(A).decode_streak == 1
    assert b.health(B).decode_streak == 0
    assert charged(b) == [A]
    empties.answered(C, 2.0, b, b._log)  # a second token: the empty stream was charged already
    assert b.health(A).decode_streak == 1
    assert charged(b) == [A]


def test_no_answer_or_an_answer_from_the_same_engine_charges_nobody() -> None:
    b = breaker()
    unanswered = EmptyStreams("r1")
    unanswered.ended_empty(A, b.epoch(A), P0)  # the request ends without a token: a legit empty
    same = EmptyStreams("r2")
    same.ended_empty(B, b.epoch(B), P0)
    same.answered(B, 1.0, b, b._log)  # the same engine answered after all
    assert [b.health(u).decode_streak for u in (A, B, C)] == [0, 0, 0]
    assert charged(b) == []


def test_every_other_empty_consumer_of_the_request_is_charged_once() -> None:
    b = breaker(eject_after=3)
    empties = EmptyStreams("r1")
    empties.ended_empty(A, b.epoch(A), P0)
    empties.ended_empty(B, b.epoch(B), None)
    empties.answered(C, 1.0, b, b._log)
    assert [b.health(u).decode_streak for u in (A, B, C)] == [1, 1, 0]
    assert charged(b) == [A, B]


def test_the_eject_after_boundary_counts_answered_empty_streams() -> None:
    b = breaker(eject_after=2)
    for index, now in enumerate((1.0, 2.0)):
        empties = EmptyStreams(f"r{index}")
        empties.ended_empty(A, b.epoch(A), P0)
        empties.answered(B, now, b, b._log)
        expected = EngineState.READY if index == 0 else EngineState.EJECTED
        assert b.state(A, now) is expected  # not at the first, exactly at the second
    assert b.health(A).probe_producer == P0, "the readmission probe reuses that producer"


def test_a_completed_stream_between_two_empty_ones_resets_the_streak() -> None:
    b = breaker(eject_after=2)
    first = EmptyStreams("r1")
    first.ended_empty(A, b.epoch(A), P0)
    first.answered(B, 1.0, b, b._log)
    b.on_success(A, b.epoch(A), 1.5, phase="decode")
    second = EmptyStreams("r2")
    second.ended_empty(A, b.epoch(A), P0)
    second.answered(B, 2.0, b, b._log)
    assert b.health(A).decode_streak == 1
    assert b.state(A, 2.0) is EngineState.READY


def test_a_charge_from_before_an_ejection_and_readmission_is_stale() -> None:
    b = breaker(eject_after=1)
    empties = EmptyStreams("r1")
    empties.ended_empty(A, b.epoch(A), P0)  # placed at epoch 0
    b.on_failure(A, b.epoch(A), 1.0, phase="decode")  # ejected meanwhile (epoch 1)
    assert b.due_probes(100.0) == [A]
    b.on_probe(A, 100.0, ProbeOutcome.PASSED)  # readmitted (epoch 2)
    empties.answered(B, 101.0, b, b._log)
    assert b.state(A, 101.0) is EngineState.READY
    assert b.health(A).decode_streak == 0
    assert [d.kind for d in b._log.entries if d.engine == A][-1] == "stale"


# ---------------------------------------------------------------------- through the lifecycle


def policies_for(consumers: tuple[str, ...], **recovery: Any) -> Policies:
    cfg = parse_config(
        {
            "engine": {"first_token_timeout_s": 1.0, "decode_read_timeout_s": 0.5},
            "recovery": {"eject_after": 2, "max_attempts": 2, **recovery},
            "engines": [{"url": P0, "role": "prefill"}]
            + [{"url": url, "role": "decode"} for url in consumers],
        }
    )
    return Policies(cfg, seed=3)


def serve_one(
    policies: Policies, clock: VirtualClock, transport: ScriptedTransport, request_id: str
) -> Any:
    request = parse_client_request(
        COMPLETIONS,
        {"prompt": "x", "max_tokens": 4, "stream": True},
        request_id=request_id,
        arrival=clock.now(),
    )
    return run(serve_request(request, make_ports(clock, transport), policies, RecordingSink()))


def test_the_retry_avoids_the_empty_consumer_and_its_token_charges_it() -> None:
    policies, clock = policies_for((A, B)), VirtualClock()
    transport = ScriptedTransport(clock, {A: [EMPTY] * 12, B: [ANSWER] * 12})
    on_a = 0
    for index in range(12):  # wherever the first attempt goes, the request is answered by B
        record = serve_one(policies, clock, transport, f"r{index}")
        assert record.status == 200
        assert record.engines[-1] == B
        if A in record.engines:
            on_a += 1
            assert record.engines == (P0, A, P0, B), "the retry never returns to A"
    assert on_a == 2, "two answered empty streams reach eject_after = 2: A is ejected"
    assert policies.breaker.state(A, clock.now()) is EngineState.EJECTED
    assert charged_in(policies.log) == [A, A]
    assert policies.placement.in_flight() == 0


def test_a_request_empty_on_every_consumer_charges_nobody() -> None:
    policies, clock = policies_for((A, B)), VirtualClock()
    transport = ScriptedTransport(clock, {A: [EMPTY] * 3, B: [EMPTY] * 3})
    for index in range(3):  # a legitimately empty completion, wherever it runs
        record = serve_one(policies, clock, transport, f"r{index}")
        assert record.status == 502 and record.attempts == 2
        assert set(record.engines) == {P0, A, B}
    breaker = policies.breaker
    assert [breaker.health(u).decode_streak for u in (A, B)] == [0, 0]
    assert [breaker.state(u, clock.now()) for u in (A, B)] == [EngineState.READY] * 2


FIVE = tuple(f"http://d{i}" for i in range(5))
HUNG, STALLING, EMPTYING, HEALTHY = FIVE[0], FIVE[1], FIVE[2], FIVE[3:]
HANGS = Decode(items=(), end="hang")
STALLS = Decode(items=tuple((0.01, token(c)) for c in "ABC"), end="hang")


def test_three_bad_of_five_consumers_two_ejected_and_the_capped_one_a_last_resort() -> None:
    """Two of five consumers may be ejected (max_ejection_percent = 50): the third bad one to
    reach eject_after is CAPPED and gets no attempt while a healthy consumer is ready."""
    policies, clock = policies_for(FIVE), VirtualClock()
    scripts: dict[str, list[Any]] = {HUNG: [HANGS] * 50, STALLING: [STALLS] * 50}
    scripts[EMPTYING] = [EMPTY] * 50
    scripts.update({url: [ANSWER] * 200 for url in HEALTHY})
    transport = ScriptedTransport(clock, scripts)
    breaker = policies.breaker
    placed: Counter[str] = Counter()
    capped_at: int | None = None
    for index in range(60):
        record = serve_one(policies, clock, transport, f"r{index}")
        consumers = [url for url in record.engines if url != P0]
        placed.update(consumers)
        if capped_at is not None:
            assert record.status == 200
            assert not set(consumers) & {HUNG, STALLING, EMPTYING}, "capped: a last resort"
        states = [breaker.state(url, clock.now()) for url in (HUNG, STALLING, EMPTYING)]
        if capped_at is None and EngineState.CAPPED in states:
            capped_at = index
            assert states.count(EngineState.EJECTED) == 2
    assert capped_at is not None and capped_at < 10
    assert [placed[url] for url in (HUNG, STALLING, EMPTYING)] == [2, 2, 2]  # eject_after each
