"""A request's entry: admitted requests are served and give their slot back on every path;
a refused one gets 503 + Retry-After in OpenAI's shape and one record, and no engine hears of
it (nothing placed, nothing called, nobody charged)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from narwhal.core.config import parse_config
from narwhal.core.entry import admit_and_serve
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.ports import ClientGone
from narwhal.core.records import RequestRecord
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    Cancelled,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
)

P0, D0 = "http://p0", "http://d0"


def setup(limit: int, retry_after_s: int = 1) -> tuple[Policies, list[RequestRecord]]:
    config = parse_config(
        {
            "admission": {"max_requests_in_flight": limit, "retry_after_s": retry_after_s},
            "engines": [{"url": P0, "role": "prefill"}, {"url": D0, "role": "decode"}],
        }
    )
    records: list[RequestRecord] = []
    return Policies(config, seed=3, on_record=records.append), records


def enter(
    policies: Policies, sink: RecordingSink, clock: VirtualClock | None = None
) -> ScriptedTransport:
    clock = clock or VirtualClock()
    transport = ScriptedTransport(clock, {})
    body: dict[str, Any] = {"prompt": "hello", "max_tokens": 3, "stream": True}
    request = parse_client_request(COMPLETIONS, body, request_id="req1", arrival=clock.now())
    with contextlib.suppress(Cancelled):
        ports = make_ports(clock, transport)
        serve = functools.partial(serve_request, request, ports, policies, sink)
        run(admit_and_serve(request.request_id, request.arrival, ports, policies, sink, serve))
    return transport


def test_the_last_free_slot_admits_and_is_given_back() -> None:
    policies, records = setup(limit=2)
    assert policies.admission.try_admit(0.0, "other")  # one request already in flight
    sink = RecordingSink()
    transport = enter(policies, sink)
    assert sink.status == 200 and [r.status for r in records] == [200]
    assert len(transport.calls) == 2  # prefill and decode legs
    assert policies.admission.in_flight == 1 and policies.admission.refused == 0


def test_one_past_the_bound_is_refused_at_once_and_charges_nobody() -> None:
    policies, records = setup(limit=1, retry_after_s=4)
    assert policies.admission.try_admit(0.0, "other")
    sink = RecordingSink()
    transport = enter(policies, sink)
    assert sink.status == 503 and sink.headers == {"retry-after": "4"}
    assert sink.body is not None
    error = sink.body["error"]
    assert (error["type"], error["code"]) == ("router_overloaded", 503)
    assert "admission.max_requests_in_flight" in error["message"]
    assert transport.calls == []  # no engine was asked anything
    [record] = records
    assert (record.status, record.outcome, record.attempts, record.engines) == (
        503,
        "overloaded",
        0,
        (),
    )
    assert record.finished_s == 0.0 and not record.committed
    kinds = [d.kind for d in policies.log.entries]
    assert kinds == ["admission_refused"]  # no placement, no status of an engine leg
    assert all(policies.breaker.health(u).streak == 0 for u in (P0, D0))
    assert policies.placement.in_flight() == 0 and policies.budget.active_requests == 0
    assert policies.admission.in_flight == 1 and policies.admission.refused == 1


def test_a_client_gone_before_its_refusal_is_recorded_as_gone() -> None:
    class Gone(RecordingSink):
        async def respond(
            self, status: int, body: Any, headers: dict[str, str], deadline: float
        ) -> None:
            raise ClientGone()

    policies, records = setup(limit=1)
    assert policies.admission.try_admit(0.0, "other")
    enter(policies, Gone())
    assert [(r.status, r.outcome) for r in records] == [(499, "client_gone")]


def test_a_request_cancelled_mid_stream_gives_its_slot_back() -> None:
    policies, records = setup(limit=1)
    clock = VirtualClock()
    clock.cancel_at = clock.now() + 0.001  # the client leaves during the prefill leg
    enter(policies, RecordingSink(), clock)
    assert [r.outcome for r in records] == ["client_gone"]
    assert policies.admission.in_flight == 0
    assert policies.admission.try_admit(clock.now(), "next")  # the slot is free again
