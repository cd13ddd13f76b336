"""The two legs: the prefill leg's outcomes, the decode leg's open, deadlines per read, faults
after the events before them, and bursts read exactly as the same reads one at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.errors import FaultKind
from narwhal.core.legs import (
    MAX_EVENT_BYTES,
    MAX_REPLY_BYTES,
    DecodeLeg,
    PrefillOutcome,
    ReadEvents,
    prefill_leg,
    prompt_tokens_of,
    read_prefill_reply,
    stale_handoff,
)
from narwhal.core.ports import Burst, Chunk, Reply, StreamEnd, TimedOut
from narwhal.core.requests import COMPLETIONS, ClientRequest
from narwhal.core.sse import EventKind, SseEvent
from tests.core.scripted import DONE as DONE_EVENT
from tests.core.scripted import (
    Decode,
    Prefill,
    ScriptedTransport,
    VirtualClock,
    descriptor,
    inband_error,
    run,
)
from tests.core.scripted import token as tok

TOKEN = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
META = b'data: {"choices":[{"index":0,"text":"","finish_reason":null}]}\n\n'
ERROR = b'data: {"error":{"message":"boom","type":"x","code":503}}\n\n'
DONE = b"data: [DONE]\n\n"
# a token event cut in two reads: a read of TAIL is a token only after HEAD (so a repeated read
# is the same events only where it starts at an event's boundary)
HEAD, TAIL = TOKEN[:20], TOKEN[20:]
P, C = "http://p", "http://c"


def pairs(read: ReadEvents) -> list[tuple[float, SseEvent]]:
    """A read's events as ``(arrival time, event)`` pairs."""
    return list(zip(read.times, read.events, strict=True))


def burst(*reads: tuple[float, bytes]) -> Burst:
    """A burst of ``(arrival time, bytes)`` reads."""
    return Burst([at for at, _ in reads], [data for _, data in reads])


def reader(first_token_at: float = 1.0, silence: float = 0.5, deadline: float = 10.0) -> DecodeLeg:
    """A decode leg created at time 0 (only its sans-IO ``read`` is used)."""
    clock = VirtualClock(start=0.0)
    return DecodeLeg(
        ScriptedTransport(clock, {}),
        clock,
        C,
        first_token_timeout_s=first_token_at,
        decode_read_timeout_s=silence,
        request_deadline=deadline,
    )


def test_deadline_moves_with_each_read_after_the_first_token_only() -> None:
    r = reader()
    # metadata before a token: the deadline is unchanged
    assert pairs(r.read(Chunk(META), 0.2)) and r.deadline == 1.0
    events = pairs(r.read(Chunk(TOKEN), 0.3))
    assert [e.kind for _, e in events] == [EventKind.TOKEN] and r.deadline == 0.8
    r.read(Chunk(META), 0.7)
    assert r.deadline == 1.2  # any chunk after the first token resets the silence timer
    r.read(Chunk(TOKEN), 9.8)
    assert r.deadline == 10.0  # never past the request deadline


def test_silence_restarts_when_the_router_turns_back_after_a_write() -> None:
    r = reader()  # silence 0.5 s, request deadline 10 s
    assert r.resumed(0.5) is False and r.deadline == 1.0  # before the first token: unchanged
    r.read(Chunk(TOKEN), 0.3)
    assert r.deadline == 0.8
    assert r.resumed(0.6) is False  # the write ended before the silence deadline
    assert r.deadline == 1.1  # silence measured from the write's end, not from 0.3
    assert r.resumed(1.1) is True  # ended exactly at the deadline: counting it would blame
    assert r.deadline == 1.6
    assert r.resumed(1.2) is False and r.deadline == 1.7
    r.read(Chunk(TOKEN), 1.3)
    assert r.deadline == 1.8  # a chunk still restarts it: max(last chunk, last resume)


def test_resuming_never_moves_the_deadline_past_the_request_deadline() -> None:
    r = reader(deadline=2.0)
    r.read(Chunk(TOKEN), 0.3)
    assert r.resumed(1.8) is True and r.deadline == 2.0
    assert r.resumed(5.0) is False and r.deadline == 2.0  # the request's: nobody's silence
    zero = reader(silence=0.0)
    zero.read(Chunk(TOKEN), 0.3)
    assert zero.resumed(4.0) is False and zero.deadline == 10.0


def test_resuming_after_the_end_or_a_fault_changes_nothing() -> None:
    done = reader()
    done.read(Chunk(TOKEN + DONE), 0.3)
    assert done.done and done.resumed(5.0) is False
    failed = reader()
    failed.read(Chunk(TOKEN + ERROR), 0.3)
    assert failed.fault is not None and failed.resumed(5.0) is False


def test_zero_read_timeout_means_the_request_deadline() -> None:
    r = reader(silence=0.0)
    r.read(Chunk(TOKEN), 0.3)
    assert r.deadline == 10.0


def test_burst_reads_carry_their_own_arrival_times() -> None:
    r = reader()
    events = pairs(r.read(burst((0.2, META), (0.4, TOKEN), (0.7, TOKEN)), 0.95))
    assert [(at, e.kind) for at, e in events] == [
        (0.2, EventKind.METADATA),
        (0.4, EventKind.TOKEN),
        (0.7, EventKind.TOKEN),
    ]
    assert r.deadline == 1.2 and r.fault is None


def test_burst_read_at_or_after_the_deadline_is_a_timeout_after_the_earlier_events() -> None:
    r = reader()
    events = pairs(r.read(burst((0.3, TOKEN), (0.8, TOKEN), (0.9, TOKEN)), 0.9))
    assert [at for at, _ in events] == [0.3]  # 0.8 is exactly the silence deadline (0.3 + 0.5)
    assert r.fault is not None and r.fault.kind is FaultKind.SILENCE
    late = reader()
    assert pairs(late.read(burst((1.0, TOKEN)), 1.0)) == []
    assert late.fault is not None and late.fault.kind is FaultKind.FIRST_TOKEN_TIMEOUT


def test_in_band_error_after_tokens_keeps_the_tokens_and_stops_reading() -> None:
    r = reader()
    events = pairs(r.read(burst((0.1, TOKEN), (0.2, ERROR), (0.3, TOKEN)), 0.3))
    assert [e.kind for _, e in events] == [EventKind.TOKEN]
    assert r.fault is not None and r.fault.kind is FaultKind.INBAND_ERROR
    assert r.fault.status == 503


def test_done_ends_reading_and_done_before_token_is_a_fault() -> None:
    r = reader()
    events = pairs(r.read(Chunk(TOKEN + DONE + TOKEN), 0.1))
    assert [e.kind for _, e in events] == [EventKind.TOKEN, EventKind.DONE] and r.done
    early = reader()
    assert pairs(early.read(Chunk(META + DONE), 0.1))[0][1].kind is EventKind.METADATA
    assert early.fault is not None and early.fault.kind is FaultKind.DONE_BEFORE_TOKEN


def test_close_and_timeout_results() -> None:
    closed = reader()
    closed.read(StreamEnd(), 0.1)
    assert closed.fault is not None and closed.fault.kind is FaultKind.CLOSED_BEFORE_DONE
    waited = reader()
    waited.read(TimedOut(), 1.0)
    assert waited.fault is not None and waited.fault.kind is FaultKind.FIRST_TOKEN_TIMEOUT


def _one_at_a_time(reads: list[tuple[float, bytes]]) -> tuple[list[tuple[float, str]], str | None]:
    """What a transport that hands over every read on its own (or times out) gives."""
    r = reader()
    out: list[tuple[float, str]] = []
    for at, data in reads:
        if at >= r.deadline:
            r.read(TimedOut(), r.deadline)
            break
        out += [(t, e.data) for t, e in pairs(r.read(Chunk(data), at))]
        if r.fault is not None or r.done:
            break
    return out, r.fault.kind.value if r.fault else None


def _held_back(
    reads: list[tuple[float, bytes]], cuts: set[int]
) -> tuple[list[tuple[float, str]], str | None]:
    """What a driver that holds reads back gives: it wakes the reader at the next cut (a read
    it chose to hand over at once) or at the reader's deadline, whichever comes first, with
    every read that arrived by then."""
    r = reader()
    out: list[tuple[float, str]] = []
    i = 0
    while i < len(reads):
        deadline = r.deadline
        cut = min([c for c in cuts if i < c < len(reads)] or [len(reads)])
        if reads[cut - 1][0] < deadline:
            batch, wake = reads[i:cut], reads[cut - 1][0]
        else:
            batch, wake = [read for read in reads[i:] if read[0] <= deadline], deadline
        if not batch:
            r.read(TimedOut(), deadline)
            break
        out += [(t, e.data) for t, e in pairs(r.read(burst(*batch), wake))]
        i += len(batch)
        if r.fault is not None or r.done:
            break
    return out, r.fault.kind.value if r.fault else None


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.05, 0.2, 0.45, 0.5, 0.6, 1.1]), min_size=1, max_size=12),
    kinds=st.lists(
        st.sampled_from([TOKEN, TOKEN, META, ERROR, DONE, HEAD, TAIL]), min_size=12, max_size=12
    ),
    cuts=st.sets(st.integers(1, 12)),
)
def test_any_grouping_into_bursts_reads_like_one_read_at_a_time(
    gaps: list[float], kinds: list[bytes], cuts: set[int]
) -> None:
    times, t = [], 0.0
    for gap in gaps:
        t = round(t + gap, 2)
        times.append(t)
    reads = list(zip(times, kinds, strict=False))
    assert _held_back(reads, cuts) == _one_at_a_time(reads)


def test_a_repeated_read_means_what_it_meant_the_first_time_and_a_split_one_is_parsed() -> None:
    r = reader()
    first = pairs(r.read(Chunk(TOKEN), 0.1))
    again = pairs(r.read(burst((0.2, TOKEN), (0.3, TOKEN)), 0.3))
    assert [e for _, e in again] == [first[0][1]] * 2 and r.deadline == 0.8
    half = len(TOKEN) // 2  # a read that is half an event is not taken for a repeat
    assert pairs(r.read(Chunk(TOKEN[:half]), 0.4)) == []
    assert [e.kind for _, e in pairs(r.read(Chunk(TOKEN[half:]), 0.5))] == [EventKind.TOKEN]
    assert [e.kind for _, e in pairs(r.read(Chunk(TOKEN + TOKEN), 0.6))] == [EventKind.TOKEN] * 2
    assert [e.kind for _, e in pairs(r.read(Chunk(TOKEN), 0.7))] == [EventKind.TOKEN]
    bad = b"data: {nope\n\n"
    r.read(Chunk(bad), 0.8)
    assert r.fault is not None and r.fault.kind is FaultKind.MALFORMED_RESPONSE
    # in one burst: a read that ended an event begun before it is no repeatable read (alone,
    # the same bytes are a line of another field and a blank line: no event)
    cut = reader()
    events = pairs(cut.read(burst((0.1, TOKEN), (0.2, HEAD), (0.3, TAIL), (0.4, TAIL)), 0.4))
    assert [at for at, _ in events] == [0.1, 0.3] and cut.fault is None
    again = reader()  # a read of whole events, repeated: the same events each time
    events = pairs(again.read(burst((0.1, META), (0.2, TOKEN + META), (0.3, TOKEN + META)), 0.3))
    assert [e.kind for _, e in events] == [EventKind.METADATA] + [
        EventKind.TOKEN,
        EventKind.METADATA,
    ] * 2


def test_an_event_that_never_ends_is_malformed_once_it_passes_the_bound() -> None:
    r = reader(deadline=100.0)
    assert pairs(r.read(Chunk(TOKEN), 0.1))
    piece = b"x" * (1024 * 1024)
    held = 0
    r.read(Chunk(b"data: " + piece), 0.2)  # an event begins and never ends its line
    held += 6 + len(piece)
    while held + len(piece) <= MAX_EVENT_BYTES:
        assert pairs(r.read(Chunk(piece), 0.3)) == [] and r.fault is None  # up to the bound: held
        held += len(piece)
    assert pairs(r.read(Chunk(piece), 0.4)) == []
    assert r.fault is not None and r.fault.kind is FaultKind.MALFORMED_RESPONSE
    assert r.fault.message == f"engine sent a server-sent event over {MAX_EVENT_BYTES} bytes"
    assert r.fault.status == 502 and r.fault.engine == C


def test_a_prefill_reply_past_the_bound_is_malformed() -> None:
    huge = Reply(200, b" " * (MAX_REPLY_BYTES + 1))  # what the transport keeps at most
    result = read_prefill_reply(huge, P, "NixlConnector", None)
    assert not isinstance(result, tuple) and result.kind is FaultKind.MALFORMED_RESPONSE
    assert result.message == f"prefill response over {MAX_REPLY_BYTES} bytes"
    at_bound = read_prefill_reply(Reply(200, b" " * MAX_REPLY_BYTES), P, "NixlConnector", None)
    assert not isinstance(at_bound, tuple)
    assert at_bound.message == "prefill response is not a JSON object"  # read, not refused


def test_a_prefill_reply_nested_past_the_parser_bound_is_malformed() -> None:
    deep = Reply(200, b'{"kv_transfer_params": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    result = read_prefill_reply(deep, P, "NixlConnector", None)
    assert not isinstance(result, tuple) and result.kind is FaultKind.MALFORMED_RESPONSE


@pytest.mark.parametrize(
    ("usage", "count"),
    [
        ({"prompt_tokens": 7, "completion_tokens": 1}, 7),
        ({"prompt_tokens": 0}, 0),
        ({"prompt_tokens": -1}, None),
        ({"prompt_tokens": True}, None),  # a bool is not a count
        ({"prompt_tokens": 7.0}, None),
        ({}, None),
        (None, None),
        ("7", None),
    ],
)
def test_a_prefill_reply_hands_on_the_prompt_tokens_it_reports(
    usage: Any, count: int | None
) -> None:
    payload = {"kv_transfer_params": descriptor(), "usage": usage}
    read = read_prefill_reply(Reply(200, json.dumps(payload).encode()), P, "NixlConnector", None)
    assert read == (descriptor(), count)  # a missing or bad count never blocks the handoff
    assert prompt_tokens_of(payload) == count


# ---------------------------------------------------------------- the prefill leg


def prefill(
    behaviour: Prefill, *, deadline: float = 100.0, max_age: float | None = 10.0
) -> tuple[PrefillOutcome, ScriptedTransport]:
    clock = VirtualClock(start=0.0)
    transport = ScriptedTransport(clock, {P: [behaviour]})
    request = ClientRequest("req-1", COMPLETIONS, {"prompt": "hi", "max_tokens": 9}, 0.0)
    outcome = run(
        prefill_leg(
            transport,
            clock,
            P,
            request,
            backend_request_id="req-1-p1",
            connector="NixlConnector",
            pinned_side_channel=None,
            deadline=deadline,
            max_handoff_age_s=max_age,
        )
    )
    return outcome, transport


def test_a_prefill_leg_sends_one_token_and_returns_the_validated_descriptor() -> None:
    outcome, transport = prefill(Prefill(delay=0.25))
    assert (outcome.started_at, outcome.replied_at) == (0.0, 0.25)
    assert (outcome.descriptor, outcome.fault) == (descriptor(), None)
    ((url, method, path, body, headers),) = transport.calls
    assert (url, method, path, headers) == (P, "POST", COMPLETIONS, {"X-Request-Id": "req-1-p1"})
    assert body is not None and body["max_tokens"] == 1 and body["stream"] is False
    assert body["kv_transfer_params"]["do_remote_decode"] is True


def test_a_prefill_reply_that_is_a_fault_still_tells_when_it_came() -> None:
    outcome, _ = prefill(Prefill(delay=0.25, status=503))
    assert outcome.replied_at == 0.25 and outcome.descriptor is None
    assert outcome.fault is not None and outcome.fault.kind is FaultKind.ENGINE_5XX


@pytest.mark.parametrize(
    ("deadline", "max_age", "kind", "message"),
    [
        (
            100.0,
            10.0,
            FaultKind.HANDOFF_TOO_OLD,
            "prefill took longer than max_handoff_age_s (10 s)",
        ),
        (5.0, 10.0, FaultKind.DEADLINE, "request deadline passed during prefill"),
        (5.0, None, FaultKind.DEADLINE, "request deadline passed during prefill"),
    ],
)
def test_a_prefill_that_never_answers_hits_the_tighter_bound(
    deadline: float, max_age: float | None, kind: FaultKind, message: str
) -> None:
    outcome, transport = prefill(Prefill(hang=True), deadline=deadline, max_age=max_age)
    assert outcome.replied_at is None and outcome.fault is not None
    assert (outcome.fault.kind, outcome.fault.message) == (kind, message)
    assert transport.clock.t == min(deadline, max_age or deadline)


def test_a_refused_prefill_is_a_connect_fault() -> None:
    outcome, _ = prefill(Prefill(connect="refused"))
    assert outcome.replied_at is None and outcome.fault is not None
    assert (outcome.fault.kind, outcome.fault.message) == (
        FaultKind.REFUSED,
        "prefill engine refused",
    )


def test_a_handoff_is_stale_only_past_its_age() -> None:
    assert stale_handoff(0.0, 10.0, 10.0) is None
    stale = stale_handoff(0.0, 10.5, 10.0)
    assert stale is not None and stale.kind is FaultKind.HANDOFF_TOO_OLD and stale.status == 504


# ---------------------------------------------------------------- the decode leg, driven


def decode_leg(decode: Decode) -> tuple[DecodeLeg, ScriptedTransport]:
    clock = VirtualClock()
    transport = ScriptedTransport(clock, {C: [decode]})
    leg = DecodeLeg(
        transport,
        clock,
        C,
        first_token_timeout_s=1.0,
        decode_read_timeout_s=0.5,
        request_deadline=clock.now() + 10,
    )
    return leg, transport


async def collect(leg: DecodeLeg) -> list[tuple[float, EventKind]]:
    """Every event the open leg reads until [DONE] or a fault, by arrival from the start."""
    seen: list[tuple[float, EventKind]] = []
    while leg.fault is None and not leg.done:
        read = pairs(await leg.next_read())
        seen += [(round(at - 1000.0, 6), event.kind) for at, event in read]
    return seen


def read_all(decode: Decode) -> tuple[list[tuple[float, EventKind]], FaultKind | None]:
    leg, _ = decode_leg(decode)
    assert run(leg.open(COMPLETIONS, {}, {})) is None
    seen = run(collect(leg))
    return seen, leg.fault.kind if leg.fault else None


def test_tokens_then_done_end_the_stream() -> None:
    seen, fault = read_all(Decode())
    assert fault is None
    assert [kind for _, kind in seen] == [EventKind.TOKEN, EventKind.TOKEN, EventKind.DONE]
    assert [at for at, _ in seen] == pytest.approx([0.025, 0.045, 0.045])


def test_tokens_before_an_inband_error_come_out_before_the_fault() -> None:
    # one read carries a token and the error after it
    decode = Decode(items=((0.02, tok("A") + inband_error(500)), (0.0, DONE_EVENT)))
    seen, fault = read_all(decode)
    assert [kind for _, kind in seen] == [EventKind.TOKEN]
    assert fault is FaultKind.INBAND_ERROR


def test_silence_after_a_token_is_the_between_token_timeout() -> None:
    seen, fault = read_all(Decode(items=((0.02, tok("A")),), end="hang"))
    assert [kind for _, kind in seen] == [EventKind.TOKEN]
    assert fault is FaultKind.SILENCE


def test_read_to_end_is_none_after_done_else_the_fault() -> None:
    leg, _ = decode_leg(Decode())
    assert run(leg.open(COMPLETIONS, {}, {})) is None and run(leg.read_to_end()) is None
    closed, _ = decode_leg(Decode(items=((0.02, tok("A")),), end="eof"))
    run(closed.open(COMPLETIONS, {}, {}))
    failure = run(closed.read_to_end())
    assert failure is not None and failure.kind is FaultKind.CLOSED_BEFORE_DONE


@pytest.mark.parametrize(
    ("decode", "kind", "delivered", "opened"),
    [
        (Decode(hang_before_headers=True), FaultKind.FIRST_TOKEN_TIMEOUT, True, False),
        (Decode(connect="refused"), FaultKind.REFUSED, False, False),
        (Decode(connect="reset"), FaultKind.RESET, True, False),
        (Decode(status=500), FaultKind.ENGINE_5XX, True, True),
        (Decode(status=400), FaultKind.ENGINE_4XX, True, True),
    ],
)
def test_a_stream_that_does_not_open_as_200_is_a_fault(
    decode: Decode, kind: FaultKind, delivered: bool, opened: bool
) -> None:
    leg, transport = decode_leg(decode)
    failure = run(leg.open(COMPLETIONS, {}, {}))
    assert failure is not None and failure is leg.fault and failure.kind is kind
    assert leg.delivered is delivered  # only a refused connection surely never delivered it
    if kind is FaultKind.FIRST_TOKEN_TIMEOUT:
        assert transport.clock.t == 1001.0  # the first-token deadline bounds the open
    assert (len(transport.calls), leg.handle is not None or opened) == (1, opened)


def test_the_first_token_deadline_is_never_past_the_request_deadline() -> None:
    clock = VirtualClock(start=0.0)
    transport = ScriptedTransport(clock, {C: [Decode(hang_before_headers=True)]})
    leg = DecodeLeg(
        transport,
        clock,
        C,
        first_token_timeout_s=5.0,
        decode_read_timeout_s=1.0,
        request_deadline=2.0,
    )
    assert leg.deadline == 2.0
    failure = run(leg.open(COMPLETIONS, {}, {}))
    assert failure is not None and failure.kind is FaultKind.DEADLINE and failure.engine is None


def test_close_closes_an_open_stream_once() -> None:
    leg, transport = decode_leg(Decode())
    run(leg.open(COMPLETIONS, {}, {}))
    handle: Any = leg.handle
    leg.close()
    leg.close()
    assert transport.closed == [handle] and leg.handle is None


def test_only_whole_token_and_metadata_reads_after_the_first_token_are_forwardable() -> None:
    r = reader()
    assert r.forwardable(TOKEN) is None  # before the first token: the loop commits the stream
    r.read(Chunk(TOKEN), 0.3)
    events = r.forwardable(TOKEN + META)
    assert events is not None and [e.kind for e in events] == [EventKind.TOKEN, EventKind.METADATA]
    assert r.deadline == 0.8  # looking changes nothing
    for other in (DONE, TOKEN + DONE, ERROR, b"data: not json\n\n", TOKEN[:-1]):
        assert r.forwardable(other) is None
    r.forwarded(0.6)
    assert r.deadline == 1.1  # the silence timer runs from the forwarded read
    r.forwarded(9.9)
    assert r.deadline == 10.0  # never past the request deadline


def test_a_read_looked_at_then_declined_reads_as_if_never_looked_at() -> None:
    looked, plain = reader(), reader()
    for leg in (looked, plain):
        leg.read(Chunk(TOKEN), 0.3)
    assert looked.forwardable(META + DONE) is None
    assert [(at, e.kind) for at, e in pairs(looked.read(Chunk(META + DONE), 0.4))] == [
        (at, e.kind) for at, e in pairs(plain.read(Chunk(META + DONE), 0.4))
    ]
    assert looked.done and plain.done
