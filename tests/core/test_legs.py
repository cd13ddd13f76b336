"""The decode reader: deadlines per read, faults after the events before them, and bursts read
exactly as the same reads one at a time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.errors import FaultKind
from narwhal.core.legs import MAX_EVENT_BYTES, MAX_REPLY_BYTES, DecodeReader, read_prefill
from narwhal.core.ports import Burst, Chunk, Reply, StreamEnd, TimedOut
from narwhal.core.sse import EventKind

TOKEN = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
META = b'data: {"choices":[{"index":0,"text":"","finish_reason":null}]}\n\n'
ERROR = b'data: {"error":{"message":"boom","type":"x","code":503}}\n\n'
DONE = b"data: [DONE]\n\n"


def reader(
    first_token_at: float = 1.0, silence: float = 0.5, deadline: float = 10.0
) -> DecodeReader:
    return DecodeReader(
        "http://c",
        first_token_at=first_token_at,
        first_token_timeout_s=1.0,
        decode_read_timeout_s=silence,
        request_deadline=deadline,
    )


def test_deadline_moves_with_each_read_after_the_first_token_only() -> None:
    r = reader()
    assert r.read(Chunk(META), 0.2) and r.deadline == 1.0  # metadata before a token: unchanged
    events = r.read(Chunk(TOKEN), 0.3)
    assert [e.kind for _, e in events] == [EventKind.TOKEN] and r.deadline == 0.8
    r.read(Chunk(META), 0.7)
    assert r.deadline == 1.2  # any chunk after the first token resets the silence timer
    r.read(Chunk(TOKEN), 9.8)
    assert r.deadline == 10.0  # never past the request deadline


def test_zero_read_timeout_means_the_request_deadline() -> None:
    r = reader(silence=0.0)
    r.read(Chunk(TOKEN), 0.3)
    assert r.deadline == 10.0


def test_burst_reads_carry_their_own_arrival_times() -> None:
    r = reader()
    events = r.read(Burst(((0.2, META), (0.4, TOKEN), (0.7, TOKEN))), 0.95)
    assert [(at, e.kind) for at, e in events] == [
        (0.2, EventKind.METADATA),
        (0.4, EventKind.TOKEN),
        (0.7, EventKind.TOKEN),
    ]
    assert r.deadline == 1.2 and r.fault is None


def test_burst_read_at_or_after_the_deadline_is_a_timeout_after_the_earlier_events() -> None:
    r = reader()
    events = r.read(Burst(((0.3, TOKEN), (0.8, TOKEN), (0.9, TOKEN))), 0.9)
    assert [at for at, _ in events] == [0.3]  # 0.8 is exactly the silence deadline (0.3 + 0.5)
    assert r.fault is not None and r.fault.kind is FaultKind.SILENCE
    late = reader()
    assert late.read(Burst(((1.0, TOKEN),)), 1.0) == []
    assert late.fault is not None and late.fault.kind is FaultKind.FIRST_TOKEN_TIMEOUT


def test_in_band_error_after_tokens_keeps_the_tokens_and_stops_reading() -> None:
    r = reader()
    events = r.read(Burst(((0.1, TOKEN), (0.2, ERROR), (0.3, TOKEN))), 0.3)
    assert [e.kind for _, e in events] == [EventKind.TOKEN]
    assert r.fault is not None and r.fault.kind is FaultKind.INBAND_ERROR
    assert r.fault.status == 503


def test_done_ends_reading_and_done_before_token_is_a_fault() -> None:
    r = reader()
    events = r.read(Chunk(TOKEN + DONE + TOKEN), 0.1)
    assert [e.kind for _, e in events] == [EventKind.TOKEN, EventKind.DONE] and r.done
    early = reader()
    assert early.read(Chunk(META + DONE), 0.1)[0][1].kind is EventKind.METADATA
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
        out += [(t, e.data) for t, e in r.read(Chunk(data), at)]
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
        out += [(t, e.data) for t, e in r.read(Burst(tuple(batch)), wake)]
        i += len(batch)
        if r.fault is not None or r.done:
            break
    return out, r.fault.kind.value if r.fault else None


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.05, 0.2, 0.45, 0.5, 0.6, 1.1]), min_size=1, max_size=12),
    kinds=st.lists(st.sampled_from([TOKEN, TOKEN, META, ERROR, DONE]), min_size=12, max_size=12),
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
    first = r.read(Chunk(TOKEN), 0.1)
    again = r.read(Burst(((0.2, TOKEN), (0.3, TOKEN))), 0.3)
    assert [e for _, e in again] == [first[0][1]] * 2 and r.deadline == 0.8
    half = len(TOKEN) // 2  # a read that is half an event is not taken for a repeat
    assert r.read(Chunk(TOKEN[:half]), 0.4) == []
    assert [e.kind for _, e in r.read(Chunk(TOKEN[half:]), 0.5)] == [EventKind.TOKEN]
    assert [e.kind for _, e in r.read(Chunk(TOKEN + TOKEN), 0.6)] == [EventKind.TOKEN] * 2
    assert [e.kind for _, e in r.read(Chunk(TOKEN), 0.7)] == [EventKind.TOKEN]
    bad = b"data: {nope\n\n"
    r.read(Chunk(bad), 0.8)
    assert r.fault is not None and r.fault.kind is FaultKind.MALFORMED_RESPONSE


def test_an_event_that_never_ends_is_malformed_once_it_passes_the_bound() -> None:
    r = reader(deadline=100.0)
    assert r.read(Chunk(TOKEN), 0.1)
    piece = b"x" * (1024 * 1024)
    held = 0
    r.read(Chunk(b"data: " + piece), 0.2)  # an event begins and never ends its line
    held += 6 + len(piece)
    while held + len(piece) <= MAX_EVENT_BYTES:
        assert r.read(Chunk(piece), 0.3) == [] and r.fault is None  # up to the bound: held
        held += len(piece)
    assert r.read(Chunk(piece), 0.4) == []
    assert r.fault is not None and r.fault.kind is FaultKind.MALFORMED_RESPONSE
    assert r.fault.message == f"engine sent a server-sent event over {MAX_EVENT_BYTES} bytes"
    assert r.fault.status == 502 and r.fault.engine == "http://c"


def test_a_prefill_reply_past_the_bound_is_malformed() -> None:
    huge = Reply(200, b" " * (MAX_REPLY_BYTES + 1))  # what the transport keeps at most
    result = read_prefill(huge, "http://p", "NixlConnector", None)
    assert not isinstance(result, dict) and result.kind is FaultKind.MALFORMED_RESPONSE
    assert result.message == f"prefill response over {MAX_REPLY_BYTES} bytes"
    at_bound = read_prefill(Reply(200, b" " * MAX_REPLY_BYTES), "http://p", "NixlConnector", None)
    assert not isinstance(at_bound, dict)
    assert at_bound.message == "prefill response is not a JSON object"  # read, not refused


def test_a_prefill_reply_nested_past_the_parser_bound_is_malformed() -> None:
    deep = Reply(200, b'{"kv_transfer_params": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    result = read_prefill(deep, "http://p", "NixlConnector", None)
    assert not isinstance(result, dict) and result.kind is FaultKind.MALFORMED_RESPONSE
