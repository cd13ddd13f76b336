"""The lifecycle tests' harness: a two-by-two fleet config, one request served against
scripted engines on a virtual clock, and the checks every outcome must pass (no reservation
held, fresh backend ids, every upstream stream closed)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from narwhal.core.config import parse_config
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.records import RequestRecord
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    Cancelled,
    Decode,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
    token,
)

P0, P1, D0, D1 = ("http://p0", "http://p1", "http://d0", "http://d1")


def config(max_attempts: int = 1, **engine: float) -> Any:
    return parse_config(
        {
            "engine": {
                "first_token_timeout_s": 1.0,
                "decode_read_timeout_s": 0.5,
                "request_timeout_s": 30.0,
                "max_handoff_age_s": 2.0,
                **engine,
            },
            "recovery": {"eject_after": 3, "max_attempts": max_attempts},
            "engines": [
                {"url": P0, "role": "prefill"},
                {"url": P1, "role": "prefill"},
                {"url": D0, "role": "decode"},
                {"url": D1, "role": "decode"},
            ],
        }
    )


@dataclass
class Outcome:
    record: RequestRecord | None
    sink: RecordingSink
    transport: ScriptedTransport
    policies: Policies
    clock: VirtualClock


def serve(
    scripts: dict[str, list[Any]],
    *,
    max_attempts: int = 1,
    stream: bool = True,
    endpoint: str = COMPLETIONS,
    sink: RecordingSink | None = None,
    cancel_after: float | None = None,
    body: dict[str, Any] | None = None,
    **engine: float,
) -> Outcome:
    clock = VirtualClock()
    transport = ScriptedTransport(clock, scripts)
    records: list[RequestRecord] = []
    policies = Policies(config(max_attempts, **engine), seed=7, on_record=records.append)
    sink = sink or RecordingSink()
    if sink.clock is None:
        sink.clock = clock
    if body is None:
        body = (
            {"prompt": "hello", "max_tokens": 4}
            if endpoint == COMPLETIONS
            else {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
    request = parse_client_request(
        endpoint, {**body, "stream": stream}, request_id="req1", arrival=clock.now()
    )
    if cancel_after is not None:
        clock.cancel_at = clock.now() + cancel_after
    with contextlib.suppress(Cancelled):
        run(serve_request(request, make_ports(clock, transport), policies, sink))
    assert len(records) == 1, "every request ends with exactly one record"
    return Outcome(records[0], sink, transport, policies, clock)


def streaks(out: Outcome) -> dict[str, int]:
    return {u: out.policies.breaker.health(u).streak for u in (P0, P1, D0, D1)}


def assert_clean(out: Outcome) -> None:
    assert out.policies.placement.in_flight() == 0, "every reservation released"
    assert out.policies.budget.active_requests == 0
    assert out.policies.budget.active_retries == 0
    ids = [headers["X-Request-Id"] for *_, headers in out.transport.calls]
    assert len(ids) == len(set(ids)), "fresh backend request ids for every leg"
    assert all(s.closed for s in out.transport.opened), "every upstream stream closed"


# a consumer that sends one token, then nothing: silence after visible output
SILENT_AFTER_TOKEN = Decode(items=((0.01, token("A")),), end="hang")


def charged_engines(out: Outcome) -> set[str]:
    """The engines the request left with a failure streak."""
    return {u for u, n in streaks(out).items() if n > 0}


def serve_many(
    cfg: Any, scripts: dict[str, list[Any]], n: int, *, stream: bool = True
) -> tuple[list[Any], Policies]:
    """``n`` requests one after another through one router; their client statuses."""
    clock = VirtualClock()
    transport = ScriptedTransport(clock, scripts)
    policies = Policies(cfg, seed=1)
    statuses = []
    for i in range(n):
        sink = RecordingSink()
        request = parse_client_request(
            COMPLETIONS, {"prompt": "x", "stream": stream}, request_id=f"r{i}", arrival=clock.now()
        )
        run(serve_request(request, make_ports(clock, transport), policies, sink))
        statuses.append(sink.status)
    return statuses, policies
