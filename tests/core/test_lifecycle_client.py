"""The lifecycle and a client that does not read, in virtual time, at exact boundaries: time
blocked writing is not engine silence; a write is bounded by ``min(request deadline, its start +
client.write_timeout_s)``; a client cut off for it is its own fault (no engine charged,
everything released), and a failure whose end the client did not read stays that failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from narwhal.core.config import parse_config
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.records import RequestRecord
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    DONE,
    Decode,
    Prefill,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
    token,
)

P, D = "http://p0", "http://d0"
SILENCE_S = 0.5
PREFILL_S, OPEN_S, GAP_S = 0.05, 0.005, 0.02
FIRST_TOKEN_AT = PREFILL_S + OPEN_S + GAP_S  # when the first token arrives (from arrival)
STREAM = Decode(
    items=((GAP_S, token("A")), (GAP_S, token("B")), (GAP_S, token("C")), (0.0, DONE)),
    open_delay=OPEN_S,
)
# writes of a streamed response: 0 commit, 1 the first token, 2 and 3 the next ones, 4 [DONE]
FIRST_TOKEN_WRITE = 1


@dataclass
class Served:
    record: RequestRecord
    sink: RecordingSink
    transport: ScriptedTransport
    policies: Policies
    arrival: float

    def decisions(self, kind: str) -> list[dict[str, Any]]:
        return [d.as_dict() for d in self.policies.log.entries if d.kind == kind]

    def assert_released_and_unblamed(self) -> None:
        assert self.policies.placement.in_flight() == 0
        assert self.policies.budget.active_requests == 0
        assert all(s.closed for s in self.transport.opened)
        assert self.policies.breaker.health(D).streak == 0
        assert self.decisions("eject") == []


def serve(
    decode: Decode = STREAM,
    *,
    blocked: dict[int, float],
    stream: bool = True,
    write_timeout_s: float = 2.0,
    request_timeout_s: float = 10.0,
) -> Served:
    clock = VirtualClock()
    transport = ScriptedTransport(
        clock, {"prefill": [Prefill(delay=PREFILL_S)], "decode": [decode]}
    )
    records: list[RequestRecord] = []
    cfg = parse_config(
        {
            "engine": {
                "first_token_timeout_s": 1.0,
                "decode_read_timeout_s": SILENCE_S,
                "request_timeout_s": request_timeout_s,
                "max_handoff_age_s": 2.0,
            },
            "recovery": {"eject_after": 1},
            "client": {"write_timeout_s": write_timeout_s},
            "engines": [{"url": P, "role": "prefill"}, {"url": D, "role": "decode"}],
        }
    )
    policies = Policies(cfg, seed=7, on_record=records.append)
    sink = RecordingSink(blocked=blocked, clock=clock)
    body = {"prompt": "hello", "max_tokens": 4, "stream": stream}
    arrival = clock.now()
    request = parse_client_request(COMPLETIONS, body, request_id="req1", arrival=arrival)
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    assert len(records) == 1
    return Served(records[0], sink, transport, policies, arrival)


def test_a_write_blocked_past_the_silence_timeout_is_not_engine_silence() -> None:
    out = serve(blocked={FIRST_TOKEN_WRITE: 3 * SILENCE_S})
    assert out.record.outcome == "ok" and out.record.status == 200
    assert out.sink.data_events()[-1] == "[DONE]" and out.record.output_tokens == 3
    [blocked] = out.decisions("client_blocked")
    assert blocked["blocked_s"] == pytest.approx(3 * SILENCE_S)
    assert out.decisions("client_cut") == []
    out.assert_released_and_unblamed()


def test_a_write_that_ends_before_the_silence_deadline_is_not_reported() -> None:
    out = serve(blocked={FIRST_TOKEN_WRITE: SILENCE_S / 2})
    assert out.record.outcome == "ok"
    assert out.decisions("client_blocked") == []  # it never outlasted the silence deadline


def test_each_write_is_bounded_by_its_start_plus_the_write_timeout() -> None:
    out = serve(blocked={FIRST_TOKEN_WRITE: 2.0})  # blocked exactly the write timeout: written
    assert out.record.outcome == "ok"
    starts = [out.arrival + FIRST_TOKEN_AT] * 2  # commit and first token: the read's time
    assert out.sink.deadlines[:2] == pytest.approx([t + 2.0 for t in starts])
    later = out.arrival + FIRST_TOKEN_AT + 2.0 + GAP_S  # the next token, after the block
    assert out.sink.deadlines[2] == pytest.approx(later + 2.0)


def test_a_client_blocked_past_the_write_timeout_is_cut_off_as_its_own_fault() -> None:
    out = serve(blocked={FIRST_TOKEN_WRITE: 2.0 + 1e-6})
    assert out.record.outcome == "client_too_slow" and out.record.status == 408
    assert out.record.committed
    assert out.record.finished_s == pytest.approx(FIRST_TOKEN_AT + 2.0)  # cut at the bound
    assert [c["reason"] for c in out.decisions("client_cut")] == ["write_timeout"]
    assert out.sink.timed_out_at == pytest.approx(out.arrival + FIRST_TOKEN_AT + 2.0)
    assert out.sink.writes == FIRST_TOKEN_WRITE + 1  # nothing written after the cut
    out.assert_released_and_unblamed()


@pytest.mark.parametrize("write_timeout_s", [30.0, 0.0], ids=["longer", "off"])
def test_the_request_deadline_bounds_every_write(write_timeout_s: float) -> None:
    out = serve(
        blocked={FIRST_TOKEN_WRITE: 100.0}, write_timeout_s=write_timeout_s, request_timeout_s=3.0
    )
    assert out.record.outcome == "deadline" and out.record.status == 504
    assert out.record.finished_s == pytest.approx(3.0)  # at the deadline, exactly
    assert out.sink.deadlines[FIRST_TOKEN_WRITE] == out.arrival + 3.0
    assert [c["reason"] for c in out.decisions("client_cut")] == ["request_deadline"]
    out.assert_released_and_unblamed()


def test_a_failure_the_client_did_not_read_stays_that_failure() -> None:
    silent = Decode(items=((GAP_S, token("A")),), end="hang", open_delay=OPEN_S)
    out = serve(silent, blocked={2: 100.0})  # write 2: the terminal error event
    assert out.record.outcome == "silence" and out.record.status == 504
    assert [c["reason"] for c in out.decisions("client_cut")] == ["write_timeout"]
    assert out.policies.breaker.health(D).streak == 1  # the engine did go silent
    assert out.policies.placement.in_flight() == 0


def test_a_non_streaming_client_that_does_not_read_its_answer_is_cut_off() -> None:
    out = serve(blocked={0: 100.0}, stream=False)  # write 0: the whole assembled response
    assert out.record.outcome == "client_too_slow" and out.record.status == 408
    assert not out.record.committed
    out.assert_released_and_unblamed()
