"""The request lifecycle's writes to its client, each bounded, and what a cut-off client gets.

Rule kept here: the client is charged for what the client does. Every write to it is bounded by
``min(request deadline, start of the write + client.write_timeout_s)`` (``client.write_timeout_s
= 0``: the request deadline alone); a write still blocked at that bound raises
:class:`ClientCut`, and the request ends there as the client's fault, no engine charged.

Theory of operation: :class:`ClientWrites` wraps the driver's
:class:`~narwhal.core.ports.ClientSink` for one request. ``commit``, ``send``, ``end`` and
``respond`` compute the bound from the clock when the write starts, hand it to the sink, and turn
the sink's ``TimedOut`` into :class:`ClientCut` carrying that bound. :meth:`ClientWrites.cut_reason`
and :meth:`ClientWrites.cut_final` say why the cut came (the request deadline or the write
timeout) and what the record then says: outcome ``deadline`` (504) when the request deadline came
first, ``client_too_slow`` (408) otherwise. A client that left (``ClientGone`` from the sink) is
the lifecycle's to record, as ``client_gone`` with :data:`CLIENT_GONE_STATUS`.
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.errors import Fault, FaultKind, fault
from narwhal.core.ports import ClientSink, Clock
from narwhal.core.retry import Deadline

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
CLIENT_GONE_STATUS = 499  # nginx's convention for "client closed request"
CLIENT_TOO_SLOW_STATUS = 408  # the router gave up waiting for the client (to read)


class ClientCut(Exception):
    """A write to the client was still blocked at ``deadline``: the client is cut off."""

    def __init__(self, deadline: float) -> None:
        super().__init__(deadline)
        self.deadline = deadline


def terminal_event(failure: Fault) -> bytes:
    """The one SSE event that ends a committed stream after a failure."""
    return wire.sse_event(wire.to_json(failure.error_body()))


class ClientWrites:
    """One request's bounded writes to its client (see the module's rule)."""

    def __init__(
        self, sink: ClientSink, clock: Clock, deadline: Deadline, write_timeout_s: float
    ) -> None:
        self.sink = sink
        self.clock = clock
        self.deadline = deadline
        self.write_timeout_s = write_timeout_s

    def write_deadline(self, now: float) -> float:
        """The bound of a write starting at ``now``: the client's write timeout, never past the
        request deadline."""
        timeout = self.write_timeout_s
        at = self.deadline.at
        return at if timeout <= 0 else min(at, now + timeout)

    async def commit(self, now: float) -> None:
        """HTTP 200 and the SSE headers: the stream's commit point."""
        until = self.write_deadline(now)
        if await self.sink.commit(dict(SSE_HEADERS), until) is not None:
            raise ClientCut(until)

    async def send(self, data: bytes, now: float) -> None:
        """SSE bytes of a committed stream."""
        until = self.write_deadline(now)
        if await self.sink.send(data, until) is not None:
            raise ClientCut(until)

    async def end(self, data: bytes, now: float) -> None:
        """A committed stream's last SSE bytes, then the end of its body."""
        until = self.write_deadline(now)
        if await self.sink.end(data, until) is not None:
            raise ClientCut(until)

    async def respond(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        """A whole JSON response (an error before commit, or a non-streaming success)."""
        until = self.write_deadline(self.clock.now())
        if await self.sink.respond(status, body, headers, until) is not None:
            raise ClientCut(until)

    def cut_reason(self, until: float) -> str:
        """Which bound a write still blocked at ``until`` ran into."""
        return "request_deadline" if until >= self.deadline.at else "write_timeout"

    def cut_final(self, until: float) -> tuple[int, str, str]:
        """The status, outcome and error of a request whose client was cut off at ``until``."""
        if until >= self.deadline.at:
            late = fault(
                FaultKind.DEADLINE,
                "request deadline passed while the client was not reading",
                engine=None,
                phase="client",
            )
            return (late.status, late.kind.value, late.message)
        message = f"client did not read for client.write_timeout_s ({self.write_timeout_s:g} s)"
        return (CLIENT_TOO_SLOW_STATUS, "client_too_slow", message)
