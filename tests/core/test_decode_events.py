"""stream_events: a decode stream as an async iterator, with DecodeReader's rules (the tokens a
read delivered come out before the fault that ended it; [DONE] ends the iteration)."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.decode_events import stream_events
from narwhal.core.errors import FaultKind
from narwhal.core.legs import LegFault
from narwhal.core.ports import StreamOpened
from narwhal.core.sse import EventKind
from tests.core.scripted import DONE, Decode, ScriptedTransport, VirtualClock, inband_error, run
from tests.core.scripted import token as tok

URL = "http://c0"


async def collect(decode: Decode) -> tuple[list[tuple[float, EventKind]], FaultKind | None]:
    clock = VirtualClock()
    transport = ScriptedTransport(clock, {URL: [decode]})
    opened = await transport.open_stream(URL, "/v1/completions", {}, {}, clock.now() + 10)
    assert isinstance(opened, StreamOpened)
    seen: list[tuple[float, EventKind]] = []
    events: Any = stream_events(
        transport,
        clock,
        opened.handle,
        URL,
        first_token_at=clock.now() + 1.0,
        first_token_timeout_s=1.0,
        decode_read_timeout_s=0.5,
        request_deadline=clock.now() + 10,
    )
    try:
        async for at, event in events:
            seen.append((round(at - 1000.0, 6), event.kind))
    except LegFault as leg:
        return seen, leg.fault.kind
    return seen, None


def test_tokens_then_done_end_the_iteration() -> None:
    seen, fault = run(collect(Decode()))
    assert fault is None
    assert [kind for _, kind in seen] == [EventKind.TOKEN, EventKind.TOKEN, EventKind.DONE]
    assert [at for at, _ in seen] == pytest.approx([0.025, 0.045, 0.045])


def test_tokens_before_an_inband_error_come_out_before_the_fault() -> None:
    # one read carries a token and the error after it
    decode = Decode(items=((0.02, tok("A") + inband_error(500)), (0.0, DONE)))
    seen, fault = run(collect(decode))
    assert [kind for _, kind in seen] == [EventKind.TOKEN]
    assert fault is FaultKind.INBAND_ERROR


def test_silence_after_a_token_is_the_between_token_timeout() -> None:
    seen, fault = run(collect(Decode(items=((0.02, tok("A")),), end="hang")))
    assert [kind for _, kind in seen] == [EventKind.TOKEN]
    assert fault is FaultKind.SILENCE
