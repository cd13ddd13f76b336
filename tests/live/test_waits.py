"""Deadlines on the router's attended time, over loopback: an engine answer that arrived while
the router's event loop was stalled past the wait's deadline is read, not timed out (a health
check, a prefill call, a stream read); a wait with no answer still ends, at its deadline pushed
back by the stall and no more, while without the stall ledger it ends as soon as the stall does.

(Without a ledger, whether an answer that came during a stall beats the expired timer depends on
the loop's order of work after the stall: uvloop reads the sockets of the iteration the stall
ended in, and runs what that wakes, before its next timers. So only the ledger makes the outcome
certain, which is what these tests pin down.)

The stall is a blocking call scheduled to run as soon as the wait suspends (a task that blocks
the loop right after another one sent its request), on uvloop, the router's loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from narwhal.core.ports import Chunk, Reply, StreamOpened, TimedOut
from narwhal.core.stalls import HEARTBEAT_S, STALL_TOLERANCE_S, StallLedger
from narwhal.emulator.timing import LinearTiming
from narwhal.live.clock import AnyioClock
from narwhal.live.lag import LagMonitor
from narwhal.live.transport import EngineTransport as Transport
from tests.live.conftest import Emulator

DEADLINE_S = 0.3  # the wait's deadline, which passes during the stall
STALL_S = 0.5

Stall = Callable[[], None]
Wait = Callable[[Transport, AnyioClock, str, Stall], Awaitable[Any]]


async def health_check(transport: Transport, clock: AnyioClock, url: str, stall: Stall) -> Any:
    """``GET /health`` as the maintenance loop sends it (on a pooled connection)."""
    await transport.call(url, "GET", "/health", None, {}, clock.now() + 5)
    stall()
    return await transport.call(url, "GET", "/health", None, {}, clock.now() + DEADLINE_S)


async def prefill_call(transport: Transport, clock: AnyioClock, url: str, stall: Stall) -> Any:
    body = {"prompt": "hello", "max_tokens": 1}
    stall()
    return await transport.call(url, "POST", "/v1/completions", body, {}, clock.now() + DEADLINE_S)


async def stream_read(transport: Transport, clock: AnyioClock, url: str, stall: Stall) -> Any:
    """A read of a stream in full flow (a token every few milliseconds)."""
    body = {"prompt": "hello", "max_tokens": 400, "stream": True}
    opened = await transport.open_stream(url, "/v1/completions", body, {}, clock.now() + 5)
    assert isinstance(opened, StreamOpened) and opened.status == 200
    try:
        for _ in range(20):
            assert isinstance(await transport.next_chunk(opened.handle, clock.now() + 5), Chunk)
        stall()
        return await transport.next_chunk(opened.handle, clock.now() + DEADLINE_S)
    finally:
        transport.close_stream(opened.handle)


def run_through_a_stall(url: str, wait: Wait, ledger: StallLedger | None) -> tuple[Any, float]:
    """``wait``, whose measured wait is covered by a stall of the loop, and how long after
    its start it returned; on uvloop."""

    async def main() -> tuple[Any, float]:
        clock = AnyioClock()
        loop = asyncio.get_running_loop()
        async with anyio.create_task_group() as group:
            if ledger is not None:
                group.start_soon(LagMonitor(clock, ledger).run)
            began: list[float] = []

            def stall() -> None:
                began.append(clock.now())
                loop.call_soon(time.sleep, STALL_S)

            async with Transport(clock, stalls=ledger) as transport:
                result = await wait(transport, clock, url, stall)
                took = clock.now() - began[0]
            if ledger is not None:  # the answer may be read before the monitor's next turn
                with anyio.move_on_after(2.0):
                    while ledger.count == 0:
                        await anyio.sleep(0.01)
            group.cancel_scope.cancel()
        return result, took

    return anyio.run(main, backend_options={"use_uvloop": True})


@pytest.mark.parametrize("wait", [health_check, prefill_call, stream_read])
def test_an_answer_that_came_during_a_stall_is_read_not_timed_out(
    emulator: Callable[..., Emulator], wait: Wait
) -> None:
    engine = emulator(role="both", timing=LinearTiming(decode_s_per_token=0.002))
    ledger = StallLedger()
    got, took = run_through_a_stall(engine.url, wait, ledger)
    assert isinstance(got, Reply | Chunk)
    assert took > DEADLINE_S  # read after its deadline had passed, during the stall
    # the stall was seen (a busy machine may add jitter-sized ones)
    assert ledger.count >= 1 and ledger.total_s >= STALL_S - 0.1


def test_a_wait_with_no_answer_ends_at_its_deadline_plus_the_stall(
    emulator: Callable[..., Emulator],
) -> None:
    hung = emulator(role="both", timing=LinearTiming(overhead_s=5.0))  # answers far too late
    ledger = StallLedger()
    got, took = run_through_a_stall(hung.url, prefill_call, ledger)
    assert isinstance(got, TimedOut)
    assert ledger.count >= 1
    # the deadline moved by the stall, no more; the stall is measured by heartbeats, so to
    # within a heartbeat period plus the tolerance (stalls.py: the precision under stalls)
    precision = HEARTBEAT_S + STALL_TOLERANCE_S
    assert DEADLINE_S + STALL_S - precision <= took < DEADLINE_S + STALL_S + 0.5
    # without the ledger the deadline is exact: it came due during the stall, so the wait
    # ends as soon as the stall does
    got, took = run_through_a_stall(hung.url, prefill_call, None)
    assert isinstance(got, TimedOut), (got, took)
    assert STALL_S <= took < STALL_S + 0.2
