"""The ports: the only way core code touches time, engines and the client.

Rule kept here: nothing in this module performs I/O. It declares the values that cross the
boundary between the pure core and a driver (live: llhttp protocols, server and engine client, on
uvloop; simulation: SimPy), and the Protocols a driver implements.

Theory of operation: core coroutines (``async def``) await only objects returned by these ports.
Live, the port methods are real coroutines on the router's asyncio loop. In the simulation, they
return small awaitables that yield a request to a driver, which turns it into SimPy events and
sends the result back. Deadlines are absolute times on the port's clock and are passed as
arguments; core never starts timers of its own. Writes to the client are bounded the same way (a
deadline in, ``TimedOut`` out). Results are values, never exceptions, so that one lifecycle
handles every outcome explicitly; their attributes are ``Final`` (the type checker refuses a
write). The only exception that crosses a port is :class:`ClientGone` (the client went away),
raised by the client sink, and whatever cancellation the driver uses; core cleans up in
``finally`` blocks with synchronous calls only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

# ---------------------------------------------------------------- engine-call results


class Reply:
    """A complete (non-streaming) HTTP response from an engine: its status and body (no
    decision reads an engine's response headers, so none are carried)."""

    __slots__ = ("body", "status")

    def __init__(self, status: int, body: bytes) -> None:
        self.status: Final = status
        self.body: Final = body


class ConnectFailed:
    """The engine could not be reached or dropped the connection before a full response."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason: Final = reason  # "refused" | "reset" | free text from the transport


class TimedOut:
    """The deadline passed before the awaited thing happened."""

    __slots__ = ()


CallResult = Reply | ConnectFailed | TimedOut


class StreamOpened:
    """Response headers arrived. ``body`` holds the whole body when ``status != 200``."""

    __slots__ = ("body", "handle", "status")

    def __init__(self, handle: Any, status: int, body: bytes = b"") -> None:
        self.handle: Final = handle
        self.status: Final = status
        self.body: Final = body


OpenResult = StreamOpened | ConnectFailed | TimedOut


class Chunk:
    """Bytes read from an upstream stream (any transport chunk, metadata or not)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data: Final = data


class Burst:
    """Several reads handed over at once, oldest first: their arrival times and their bytes,
    side by side (``times[i]`` is when ``chunks[i]`` arrived).

    The core treats a burst exactly as the same reads one at a time (a read stamped at or after
    the deadline then in force is a timeout). So a driver may hold a read back, stamped with when
    it arrived, while that read can only move the read deadline later and ends nothing: a plain
    chunk after the stream's first generated token. It hands held reads over no later than the
    deadline of the read it answers, and at once anything that may move the deadline earlier or
    end the stream (the first token, ``[DONE]``, an error event, a close). Then the outcome does
    not depend on how the reads were grouped.
    """

    __slots__ = ("chunks", "times")

    def __init__(self, times: list[float], chunks: list[bytes]) -> None:
        if len(times) != len(chunks):
            raise ValueError(f"{len(times)} arrival times for {len(chunks)} reads")
        self.times: Final = times
        self.chunks: Final = chunks


class StreamEnd:
    """The upstream closed the stream cleanly (EOF)."""

    __slots__ = ()


ChunkResult = Chunk | Burst | StreamEnd | ConnectFailed | TimedOut


class ClientGone(Exception):
    """The client disconnected; raised by a :class:`ClientSink` method."""


# ---------------------------------------------------------------- the ports


class Clock(Protocol):
    """Time as the driver defines it (monotonic seconds for live, SimPy time in the simulation)."""

    def now(self) -> float: ...

    def wall(self) -> float:
        """Seconds since the epoch, for display only (``/status``)."""
        ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...


Relay = Callable[[bytes, float], "float | None"]
"""Takes one read of a stream (its bytes, its arrival time) where it arrives, without waking
the reader: returns the deadline of the stream's next read when it forwarded the read, None when
the read is left to :meth:`Transport.next_chunk` (which then returns those same bytes)."""


class Transport(Protocol):
    """Calls engines. Every method returns a result value; none raises for engine faults."""

    def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> Awaitable[CallResult]: ...

    def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> Awaitable[OpenResult]: ...

    def next_chunk(self, handle: Any, deadline: float) -> Awaitable[ChunkResult]: ...

    def relay_reads(self, handle: Any, relay: Relay) -> bool:
        """From now on, offer each read of the stream that arrives while :meth:`next_chunk` is
        awaited to ``relay`` first (until the stream is closed); False when this transport
        cannot, and every read goes to :meth:`next_chunk`."""
        ...

    def close_stream(self, handle: Any) -> None:
        """Abandon a stream (aborting the engine request). Synchronous: safe in ``finally``."""
        ...

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        """Best effort, fire and forget: free a producer's KV blocks nobody will pull."""
        ...


WriteResult = TimedOut | None
"""A write to the client: None when written, ``TimedOut`` when it was still blocked at its
deadline (the client did not read; nothing of it was sent)."""


class ClientSink(Protocol):
    """Where the response to the client goes. Raises :class:`ClientGone` if the client left.

    Every write is bounded by ``deadline``: a write the client does not make room for by then
    is abandoned (``TimedOut``), and the sink writes nothing after that. A write whose deadline
    has already passed is still made when it does not have to wait.
    """

    def respond(
        self, status: int, body: dict[str, Any], headers: dict[str, str], deadline: float
    ) -> Awaitable[WriteResult]:
        """A complete JSON response (errors before commit, non-streaming successes)."""
        ...

    def commit(self, headers: dict[str, str], deadline: float) -> Awaitable[WriteResult]:
        """Send HTTP 200 and SSE headers: the commit point of a streaming response."""
        ...

    def send(self, data: bytes, deadline: float) -> Awaitable[WriteResult]:
        """Send SSE bytes after commit."""
        ...

    def send_now(self, data: bytes) -> bool:
        """Send SSE bytes after commit if that needs no wait: False, sending nothing, when the
        client has left or been cut off or is not taking its bytes (then :meth:`send` them)."""
        ...

    def end(self, data: bytes, deadline: float) -> Awaitable[WriteResult]:
        """Send a committed stream's last SSE bytes and end its body (in one write, where the
        sink can): nothing is sent after it."""
        ...


class Waiter(Protocol):
    """One queued request's wait (flow control): :meth:`wait` returns True once :meth:`wake`
    was called (at once if it already was), False at ``deadline``. ``wake`` is synchronous and
    never resumes the waiter inside the caller's step."""

    def wait(self, deadline: float) -> Awaitable[bool]: ...

    def wake(self) -> None: ...


Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


@dataclass
class Ports:
    """What a driver hands to the core. ``spawn`` runs a background coroutine concurrently;
    ``waiter`` makes a :class:`Waiter` (None: the driver cannot queue, and ``[flow]`` stays
    off for it)."""

    clock: Clock
    transport: Transport
    spawn: Spawn
    waiter: Callable[[], Waiter] | None = None
