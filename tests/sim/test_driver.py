"""The driver's shared deadline timer: exact times, add order, no SimPy event for a deadline that
stopped mattering, and the transport's call and stream deadlines on top of it."""

from __future__ import annotations

from typing import Any

import simpy

from narwhal.core.ports import StreamOpened, TimedOut
from narwhal.sim.driver import Deadlines, start
from tests.sim.test_engine import URL, make, prefill_body


class Waiter:
    """A deadline that records when it expired; ``done`` makes it stop mattering."""

    def __init__(self, name: str, log: list[tuple[str, float]], env: simpy.Environment) -> None:
        self.name, self.log, self.env = name, log, env
        self.done = False

    def pending(self, at: float) -> bool:
        return not self.done

    def expire(self, at: float) -> None:
        assert at == self.env.now
        self.log.append((self.name, self.env.now))


def scheduled_events(env: simpy.Environment) -> int:
    """SimPy events still to come (``run(until=...)`` leaves its own stop event behind)."""
    return sum(1 for at, *_ in env._queue if at > env.now)


def test_deadlines_expire_at_their_exact_times_in_add_order() -> None:
    env = simpy.Environment()
    log: list[tuple[str, float]] = []
    deadlines = Deadlines(env)
    deadlines.add(2.0, Waiter("late", log, env))
    deadlines.add(0.5, Waiter("early", log, env))  # earlier than the armed timer: re-armed
    deadlines.add(2.0, Waiter("late-2", log, env))
    env.run(until=1.9999)
    assert log == [("early", 0.5)]
    env.run(until=3.0)
    assert log == [("early", 0.5), ("late", 2.0), ("late-2", 2.0)]


def test_a_deadline_that_stopped_mattering_costs_no_event() -> None:
    env = simpy.Environment()
    log: list[tuple[str, float]] = []
    deadlines = Deadlines(env)
    first = Waiter("first", log, env)
    deadlines.add(1.0, first)
    settled = [Waiter(f"settled-{i}", log, env) for i in range(50)]
    for i, waiter in enumerate(settled):
        deadlines.add(1.0 + 0.01 * (i + 1), waiter)
        waiter.done = True  # the call returned: its deadline no longer matters
    deadlines.add(5.0, Waiter("last", log, env))
    assert scheduled_events(env) == 1  # one timer, at the earliest deadline
    first.done = True
    env.run(until=1.0 + 1e-9)  # the timer fires, finds nothing pending, skips all 50
    assert log == []
    assert scheduled_events(env) == 1 and max(at for at, *_ in env._queue) == 5.0
    env.run()
    assert log == [("last", 5.0)]


def test_call_and_stream_deadlines_through_the_transport() -> None:
    """A prefill call past its deadline times out then (and the engine drops the request); a
    stream read on a hung engine times out at exactly its deadline."""
    env, engine, transport = make()
    seen: dict[str, Any] = {}

    async def caller() -> None:
        body = prefill_body(8000)  # a long prompt: several engine steps
        result = await transport.call(URL, "POST", "/v1/completions", body, {}, env.now + 0.004)
        seen["call"] = (result, env.now, len(engine.scheduler.seqs))
        engine.set_hung(True)
        opened = await transport.open_stream(URL, "/v1/completions", {"prompt": "x"}, {}, 99.0)
        assert isinstance(opened, StreamOpened)
        deadline = env.now + 0.25
        result = await transport.next_chunk(opened.handle, deadline)
        seen["read"] = (result, env.now, deadline)

    start(env, caller())
    env.run(until=5)
    result, at, in_flight = seen["call"]
    assert isinstance(result, TimedOut) and at == 0.004 and in_flight == 0
    result, at, deadline = seen["read"]
    assert isinstance(result, TimedOut) and at == deadline


def test_a_closed_streams_read_deadline_costs_no_event() -> None:
    """Closing a stream (the router's cleanup) drops its pending read deadline: the shared timer
    skips it instead of firing for it."""
    env, engine, transport = make()
    engine.set_hung(True)  # silent streams: every read waits for its deadline
    handles: list[Any] = []

    async def reader(deadline: float) -> None:
        opened = await transport.open_stream(URL, "/v1/completions", {"prompt": "x"}, {}, 99.0)
        assert isinstance(opened, StreamOpened)
        handles.append(opened.handle)
        await transport.next_chunk(opened.handle, deadline)

    for deadline in (1.0, 1.1, 1.2, 2.0):
        start(env, reader(deadline))
    env.run(until=0.5)
    for handle in handles[:3]:
        transport.close_stream(handle)
    env.run(until=1.0 + 1e-9)  # the timer armed for 1.0 fires and finds 1.0 to 1.2 closed
    assert [at for at, *_ in env._queue if at > env.now] == [2.0]
