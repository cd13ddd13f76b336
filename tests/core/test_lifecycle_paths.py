"""The request lifecycle along its paths, with scripted engines: what a success streams and
measures, the legs' bodies, metadata and the two timers, non-streaming clients, client
disconnects, the retry bounds (deadline, budget), ejection through the lifecycle, and who owns
a handoff when a leg fails."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.core.config import parse_config
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.ports import TimedOut
from narwhal.core.requests import CHAT, COMPLETIONS, parse_client_request
from tests.core.lifecycle_harness import (
    D0,
    D1,
    P0,
    SILENT_AFTER_TOKEN,
    assert_clean,
    charged_engines,
    config,
    serve,
    serve_many,
)
from tests.core.scripted import (
    DONE,
    ROLE_CHUNK,
    USAGE_CHUNK,
    Cancelled,
    Decode,
    Prefill,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    descriptor,
    make_ports,
    run,
    token,
)


def test_success_streams_exactly_the_engine_tokens_and_measures() -> None:
    items = ((0.2, token("A")), (0.1, token("B")), (0.1, USAGE_CHUNK), (0.0, DONE))
    out = serve({"prefill": [Prefill(delay=0.3)], "decode": [Decode(items=items)]})
    assert out.record is not None and out.record.status == 200
    assert out.sink.sse_events() == [token("A"), token("B"), USAGE_CHUNK, DONE]
    assert out.sink.ended and out.sink.events[-1].endswith(DONE), "[DONE] ends the body"
    assert out.record.ttft_s == pytest.approx(0.3)
    assert out.record.first_byte_s == pytest.approx(0.3 + 0.005 + 0.2)
    assert out.record.output_tokens == 2
    assert out.transport.released == []  # the consumer pulled the handoff
    assert_clean(out)


def test_prefill_leg_and_decode_leg_bodies() -> None:
    body = {
        "prompt": "hi",
        "max_tokens": 9,
        "min_tokens": 2,
        "temperature": 0.5,
        "stream_options": {"include_usage": True},
        "kv_transfer_params": {"remote_host": "evil.example", "do_remote_prefill": True},
    }
    out = serve({}, body=body)
    (_, _, path, prefill, _), (_, kind, _, decode, _) = out.transport.calls
    assert path == COMPLETIONS and kind == "STREAM"
    assert prefill is not None and decode is not None
    assert prefill["max_tokens"] == 1 and prefill["stream"] is False
    assert "min_tokens" not in prefill and "stream_options" not in prefill
    assert prefill["kv_transfer_params"]["do_remote_decode"] is True
    assert prefill["kv_transfer_params"]["remote_host"] is None  # client's value never forwarded
    assert decode["max_tokens"] == 9 and decode["temperature"] == 0.5 and decode["stream"]
    assert decode["kv_transfer_params"] == descriptor()  # validated, opaque fields verbatim
    assert decode["min_tokens"] == 2


def test_same_worker_decode_sends_no_transfer_params() -> None:
    cfg = parse_config({"engines": [{"url": "http://both", "role": "both"}]})
    clock = VirtualClock()
    transport = ScriptedTransport(clock, {})
    policies = Policies(cfg, seed=1)
    request = parse_client_request(
        COMPLETIONS,
        {"prompt": "x", "stream": True, "kv_transfer_params": {"remote_host": "evil"}},
        request_id="r",
        arrival=clock.now(),
    )
    sink = RecordingSink()
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    decode = transport.calls[1][3]
    assert decode is not None and "kv_transfer_params" not in decode
    assert sink.status == 200
    assert len(transport.released) == 1  # the producer's unused blocks are given back


def test_chat_role_chunk_is_metadata_and_flushed_on_commit() -> None:
    items = ((0.01, ROLE_CHUNK), (0.01, token("z", chat=True)), (0.0, DONE))
    out = serve({"decode": [Decode(items=items)]}, endpoint=CHAT)
    assert out.sink.sse_events() == [ROLE_CHUNK, token("z", chat=True), DONE]
    assert out.record is not None and out.record.output_tokens == 1


def test_metadata_before_first_token_does_not_reset_first_token_timer() -> None:
    items = (*tuple((0.4, USAGE_CHUNK) for _ in range(5)), (0.0, token("A")), (0.0, DONE))
    out = serve({"decode": [Decode(items=items)]})
    assert out.record is not None and out.record.status == 504


def test_metadata_after_first_token_resets_silence_timer() -> None:
    items = ((0.01, token("A")), *tuple((0.4, USAGE_CHUNK) for _ in range(5)), (0.0, DONE))
    out = serve({"decode": [Decode(items=items)]})
    assert out.record is not None and out.record.status == 200


def test_zero_read_timeout_uses_request_deadline() -> None:
    items = ((0.01, token("A")), (20.0, token("B")), (0.0, DONE))
    out = serve({"decode": [Decode(items=items)]}, decode_read_timeout_s=0.0)
    assert out.record is not None and out.record.status == 200
    late = ((0.01, token("A")), (40.0, token("B")), (0.0, DONE))
    out = serve({"decode": [Decode(items=late)]}, decode_read_timeout_s=0.0)
    assert out.record is not None and out.record.status == 504
    assert out.record.outcome == "deadline"


def test_non_streaming_client_gets_assembled_response() -> None:
    items = ((0.01, token("A")), (0.01, token("B")), (0.0, USAGE_CHUNK), (0.0, DONE))
    out = serve({"decode": [Decode(items=items)]}, stream=False)
    assert out.sink.status == 200 and out.sink.body is not None
    assert out.sink.body["choices"][0]["text"] == "AB"
    assert out.sink.body["usage"]["completion_tokens"] == 3
    decode = out.transport.calls[1][3]
    assert decode is not None and decode["stream"] is True
    assert decode["stream_options"] == {"include_usage": True}


def test_non_streaming_failure_after_first_token_is_an_http_error_not_retried() -> None:
    out = serve({"decode": [SILENT_AFTER_TOKEN]}, stream=False, max_attempts=1)
    assert out.sink.status == 504 and out.record is not None and out.record.attempts == 1


def test_non_streaming_failure_after_tokens_is_retried_nothing_was_visible() -> None:
    # DESIGN: visible output is the first token *sent to the client*; a non-streaming client
    # is sent nothing until the end, so the attempt may be retried, its tokens discarded.
    later = Decode(items=((0.5, token("C")), (0.01, token("D")), (0.0, DONE)))
    out = serve({"decode": [SILENT_AFTER_TOKEN, later]}, stream=False, max_attempts=3)
    assert out.record is not None and out.record.attempts == 2 and out.sink.status == 200
    assert out.sink.body is not None and out.sink.body["choices"][0]["text"] == "CD"
    assert out.record.output_tokens == 2  # the failed attempt's "A" is not counted
    assert out.record.first_byte_s is not None and out.record.first_byte_s > 0.5  # this attempt's
    assert_clean(out)


def test_client_disconnect_before_first_token_releases_everything() -> None:
    out = serve({"decode": [Decode(items=((5.0, token("A")),))]}, cancel_after=0.5)
    assert out.record is not None and out.record.outcome == "client_gone"
    assert charged_engines(out) == set()
    assert_clean(out)


def test_client_disconnect_after_commit() -> None:
    items = (*tuple((0.01, token(c)) for c in "ABCDEF"), (0.0, DONE))
    out = serve(
        {"decode": [Decode(items=items)]}, sink=RecordingSink(leave_after_sends=2), max_attempts=3
    )
    assert out.record is not None and out.record.outcome == "client_gone"
    assert out.record.attempts == 1 and charged_engines(out) == set()
    assert_clean(out)


def test_client_disconnect_during_prefill_releases_the_handoff_slot() -> None:
    out = serve({"prefill": [Prefill(delay=1.0)]}, cancel_after=0.5)
    assert out.record is not None and out.record.outcome == "client_gone"
    assert_clean(out)


def test_no_eligible_engine_is_503_with_retry_after() -> None:
    clock = VirtualClock()
    policies = Policies(config(), seed=3)
    for url in (D0, D1):  # every consumer down (the ejection cap holds breaker ejections)
        policies.breaker.on_health(url, clock.now(), ok=False)
    transport = ScriptedTransport(clock, {})
    sink = RecordingSink()
    request = parse_client_request(
        COMPLETIONS, {"prompt": "x"}, request_id="r", arrival=clock.now()
    )
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    assert sink.status == 503 and "retry-after" in sink.headers
    assert transport.calls == [], "no prefill is spent on a handoff no consumer could take"
    assert policies.placement.in_flight() == 0


def test_a_consumer_lost_during_the_prefill_gets_its_handoff_released() -> None:
    clock = VirtualClock()
    policies = Policies(config(), seed=3)

    class EjectingTransport(ScriptedTransport):
        async def call(self, *args: Any, **kwargs: Any) -> Any:  # both consumers go down meanwhile
            for url in (D0, D1):
                policies.breaker.on_health(url, clock.now(), ok=False)
            return await super().call(*args, **kwargs)

    transport = EjectingTransport(clock, {})
    sink = RecordingSink()
    request = parse_client_request(
        COMPLETIONS, {"prompt": "x"}, request_id="r", arrival=clock.now()
    )
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    assert sink.status == 503
    assert transport.released, "the prefill's handoff is released when no consumer can take it"
    assert policies.placement.in_flight() == 0


def test_retry_refused_when_deadline_too_short() -> None:
    # the first attempt burns 29.5 s of a 30 s deadline: too little is left to try again
    out = serve(
        {
            "prefill": [Prefill(delay=0.1)],
            "decode": [Decode(items=((29.4, b": keepalive\n\n"),), end="eof")],
        },
        max_attempts=3,
        first_token_timeout_s=29.5,
    )
    assert out.record is not None and out.record.attempts == 1 and out.record.status == 502


def test_retry_budget_exhausted_returns_original_error() -> None:
    clock = VirtualClock()
    transport = ScriptedTransport(clock, {"prefill": [Prefill(connect="refused")]})
    policies = Policies(config(max_attempts=3), seed=1)
    policies.budget.minimum = 0  # no floor and no other active requests: no room at all
    sink = RecordingSink()
    request = parse_client_request(
        COMPLETIONS, {"prompt": "x"}, request_id="r", arrival=clock.now()
    )
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    assert sink.status == 502 and sink.body is not None
    assert sink.body["error"]["message"] == "prefill engine refused"


def test_eject_after_k_failures_through_the_lifecycle() -> None:
    clock = VirtualClock()
    cfg = parse_config(
        {
            "engine": {"first_token_timeout_s": 1.0},
            "recovery": {"eject_after": 2, "panic_threshold_percent": 0},  # no panic: a 503
            "engines": [{"url": P0, "role": "prefill"}, {"url": D0, "role": "decode"}],
        }
    )
    transport = ScriptedTransport(clock, {"decode": [Decode(connect="refused")] * 2})
    policies = Policies(cfg, seed=1)
    statuses = []
    for i in range(3):
        sink = RecordingSink()
        request = parse_client_request(
            COMPLETIONS, {"prompt": "x"}, request_id=f"r{i}", arrival=clock.now()
        )
        run(serve_request(request, make_ports(clock, transport), policies, sink))
        statuses.append(sink.status)
    assert statuses == [502, 502, 503]
    assert policies.breaker.health(D0).ejected_since is not None
    assert policies.breaker.health(D0).probe_producer == P0
    assert [d.kind for d in policies.log.entries if d.kind == "eject"] == ["eject"]


def test_error_body_is_openai_shaped() -> None:
    out = serve({"prefill": [Prefill(status=502)]})
    assert out.sink.body is not None
    assert set(out.sink.body["error"]) == {"message", "type", "param", "code"}
    json.dumps(out.sink.body)


def test_a_both_engine_whose_decodes_fail_is_ejected_although_its_prefills_pass() -> None:
    both = "http://both"
    recovery = {"eject_after": 2, "panic_threshold_percent": 0}  # no panic: the role goes dark
    cfg = parse_config({"recovery": recovery, "engines": [{"url": both, "role": "both"}]})
    statuses, policies = serve_many(cfg, {"decode": [Decode(connect="refused")] * 2}, 3)
    assert statuses == [502, 502, 503]
    assert policies.breaker.health(both).ejected_since is not None


def test_a_refused_consumer_never_saw_the_handoff_so_it_is_released() -> None:
    out = serve({"decode": [Decode(connect="refused")]})
    assert out.record is not None and out.record.status == 502
    assert [(url, d["remote_engine_id"]) for url, d in out.transport.released] == [
        (out.record.engines[0], "eng-p0")
    ]
    assert_clean(out)


@pytest.mark.parametrize(
    "decode",
    [Decode(connect="reset"), Decode(hang_before_headers=True), Decode(items=(), end="reset")],
    ids=["reset", "hang_before_headers", "reset_after_headers"],
)
def test_a_consumer_that_may_have_pulled_owns_the_handoff(decode: Decode) -> None:
    out = serve({"decode": [decode]})
    assert out.record is not None and out.record.status in (502, 504)
    assert out.transport.released == []  # releasing blocks it may be reading would corrupt it
    assert_clean(out)


def test_a_descriptor_with_another_side_channel_than_pinned_is_refused() -> None:
    cfg = parse_config(
        {
            "engines": [
                {"url": P0, "role": "prefill", "kv_endpoint": "127.0.0.1:5559"},
                {"url": D0, "role": "decode"},
            ]
        }
    )
    moved = {P0: [Prefill(kv=descriptor(port=5560)), Prefill(kv=descriptor(port=5559))]}
    statuses, policies = serve_many(cfg, moved, 2)
    assert statuses == [502, 200]
    assert policies.breaker.health(P0).streak == 0  # the good one reset the prefill streak


def test_header_delay_and_token_gap_share_the_first_token_budget() -> None:
    # 0.6 s to headers + 0.6 s to the first token: each under the 1.0 s budget, not together
    late = Decode(items=((0.6, token("A")), (0.0, DONE)), open_delay=0.6)
    out = serve({"decode": [late]})
    assert out.record is not None and out.record.status == 504
    assert out.clock.now() == pytest.approx(1000.0 + 0.05 + 1.0)
    ok = Decode(items=((0.3, token("A")), (0.0, DONE)), open_delay=0.6)
    assert serve({"decode": [ok]}).sink.status == 200


class CancelledSink(RecordingSink):
    """A client whose connection is cancelled during one kind of write."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    async def respond(
        self, status: int, body: dict[str, Any], headers: dict[str, str], deadline: float
    ) -> TimedOut | None:
        if self.where == "respond":
            raise Cancelled()
        return await super().respond(status, body, headers, deadline)

    async def send(self, data: bytes, deadline: float) -> TimedOut | None:
        if (self.where == "done" and data == DONE) or (self.where == "error" and b"error" in data):
            raise Cancelled()
        return await super().send(data, deadline)


@pytest.mark.parametrize(
    ("where", "scripts", "stream"),
    [
        ("respond", {"prefill": [Prefill(connect="refused")]}, True),  # the error response
        ("respond", {}, False),  # the assembled response
        ("done", {}, True),  # the final [DONE]
        ("error", {"decode": [Decode(items=((0.01, token("A")),), end="eof")]}, True),
    ],
    ids=["error_response", "assembled_response", "done", "terminal_event"],
)
def test_a_last_write_cut_short_still_leaves_one_record(
    where: str, scripts: dict[str, list[Any]], stream: bool
) -> None:
    out = serve(scripts, stream=stream, sink=CancelledSink(where))  # serve checks: one record
    assert out.record is not None and out.record.outcome == "client_gone"
    assert out.record.status == 499
    assert_clean(out)


def test_ttft_is_the_producer_legs_completion_whatever_it_answered() -> None:
    # spec: "ttft_s: elapsed time to producer HTTP completion"
    answered = serve({"prefill": [Prefill(status=500, delay=0.3)]})
    assert answered.record is not None and answered.record.ttft_s == pytest.approx(0.3)
    bad = serve({"prefill": [Prefill(kv=descriptor(engine_id=""), delay=0.2)]})
    assert bad.record is not None and bad.record.status == 502
    assert bad.record.ttft_s == pytest.approx(0.2)
    refused = serve({"prefill": [Prefill(connect="refused")]})
    assert refused.record is not None and refused.record.ttft_s is None  # it never completed
