"""A deterministic in-memory driver for core coroutines, with scripted engines.

Virtual time: each port call resolves at once, advancing the clock to when its result would
arrive, or to the deadline if that comes first. One core coroutine runs at a time, so the
driver only has to `send(None)` and expect it to finish without suspending.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from narwhal.core.ports import (
    CallResult,
    Chunk,
    ChunkResult,
    ClientGone,
    ConnectFailed,
    OpenResult,
    Ports,
    Relay,
    Reply,
    StreamEnd,
    StreamOpened,
    TimedOut,
)


class Cancelled(BaseException):
    """What a real driver does when the client leaves mid-request: cancel the coroutine."""


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("core coroutine suspended on something that is not a port call")


class VirtualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self.cancel_at: float | None = None

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1.7e9 + self.t

    def advance_to(self, t: float) -> None:
        if self.cancel_at is not None and t >= self.cancel_at:
            self.t = self.cancel_at
            self.cancel_at = None
            raise Cancelled()
        self.t = max(self.t, t)

    async def sleep(self, seconds: float) -> None:
        self.advance_to(self.t + seconds)


def descriptor(engine_id: str = "eng-p0", port: int = 5559, blocks: Any = None) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[1, 2, 3]] if blocks is None else blocks,
        "remote_engine_id": engine_id,
        "remote_request_id": "cmpl-x-0-bf6560ae",
        "remote_host": "127.0.0.1",
        "remote_port": port,
        "tp_size": 1,
        "remote_num_tokens": 12,
        "transfer_mode": "pull",
        "opaque_future_field": {"kept": [1, "verbatim"]},
    }


# ---------------------------------------------------------------- engine behaviours


@dataclass(frozen=True)
class Prefill:
    """A prefill answer after ``delay`` s: a JSON body with ``kv`` (or ``raw`` bytes)."""

    delay: float = 0.05
    kv: Any = field(default_factory=descriptor)
    status: int = 200
    raw: bytes | None = None
    hang: bool = False
    connect: str | None = None  # "refused" | "reset"

    def body(self) -> bytes:
        if self.raw is not None:
            return self.raw
        if self.status != 200:
            code = self.status
            return json.dumps(
                {
                    "error": {
                        "message": "bad",
                        "type": "BadRequestError",
                        "param": None,
                        "code": code,
                    }
                }
            ).encode()
        return json.dumps(
            {"id": "cmpl-1", "choices": [{"text": "x"}], "kv_transfer_params": self.kv}
        ).encode()


def token(text: str, chat: bool = False) -> bytes:
    if chat:
        payload = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    else:
        payload = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


ROLE_CHUNK = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
USAGE_CHUNK = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\n'
DONE = b"data: [DONE]\n\n"


def inband_error(code: Any = 500) -> bytes:
    return (
        b"data: "
        + json.dumps(
            {
                "error": {
                    "message": "Internal server error",
                    "type": "InternalServerError",
                    "param": None,
                    "code": code,
                }
            }
        ).encode()
        + b"\n\n"
    )


@dataclass(frozen=True)
class Decode:
    """A decode stream: headers after ``open_delay``; then (gap, bytes) items; then the end.

    end: "eof" (clean close), "reset", or "hang" (silence until the reader's deadline).
    """

    items: tuple[tuple[float, bytes], ...] = ((0.02, token("A")), (0.02, token("B")), (0.0, DONE))
    end: str = "eof"
    open_delay: float = 0.005
    status: int = 200
    hang_before_headers: bool = False
    connect: str | None = None


@dataclass
class _Stream:
    items: list[tuple[float, bytes]]
    end: str
    closed: bool = False


class ScriptedTransport:
    """Engines answer from per-URL scripts; every request is recorded."""

    def __init__(self, clock: VirtualClock, scripts: dict[str, list[Any]]) -> None:
        self.clock = clock
        self.scripts = {url: list(items) for url, items in scripts.items()}
        self.calls: list[tuple[str, str, str, dict[str, Any] | None, dict[str, str]]] = []
        self.closed: list[_Stream] = []
        self.released: list[tuple[str, dict[str, Any]]] = []
        self.opened: list[_Stream] = []
        self.get_replies: dict[tuple[str, str], Any] = {}

    def _next(self, url: str, phase: str) -> Any:
        """The engine's own script first, then the shared queue of its phase, then defaults."""
        for key in (url, phase):
            script = self.scripts.get(key)
            if script:
                return script.pop(0)
        return Prefill() if phase == "prefill" else Decode()

    def _arrive(self, delay: float, deadline: float) -> bool:
        if self.clock.t + delay > deadline:
            self.clock.advance_to(deadline)
            return False
        self.clock.advance_to(self.clock.t + delay)
        return True

    async def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> CallResult:
        self.calls.append((url, method, path, body, dict(headers)))
        if method == "GET":
            answer = self.get_replies.get((url, path), Reply(200, b"{}"))
            return answer if not isinstance(answer, Prefill) else ConnectFailed("refused")
        behaviour = self._next(url, "prefill")
        assert isinstance(behaviour, Prefill), behaviour
        if behaviour.connect:
            return ConnectFailed(behaviour.connect)
        if behaviour.hang or not self._arrive(behaviour.delay, deadline):
            self.clock.advance_to(deadline)
            return TimedOut()
        return Reply(behaviour.status, behaviour.body())

    async def open_stream(
        self, url: str, path: str, body: dict[str, Any], headers: dict[str, str], deadline: float
    ) -> OpenResult:
        self.calls.append((url, "STREAM", path, body, dict(headers)))
        behaviour = self._next(url, "decode")
        assert isinstance(behaviour, Decode), behaviour
        if behaviour.connect:
            return ConnectFailed(behaviour.connect)
        if behaviour.hang_before_headers or not self._arrive(behaviour.open_delay, deadline):
            self.clock.advance_to(deadline)
            return TimedOut()
        if behaviour.status != 200:
            return StreamOpened(None, behaviour.status, Prefill(status=behaviour.status).body())
        stream = _Stream(list(behaviour.items), behaviour.end)
        self.opened.append(stream)
        return StreamOpened(stream, 200)

    async def next_chunk(self, handle: Any, deadline: float) -> ChunkResult:
        stream: _Stream = handle
        if stream.items:
            gap, data = stream.items[0]
            if not self._arrive(gap, deadline):
                return TimedOut()
            stream.items.pop(0)
            return Chunk(data)
        if stream.end == "hang":
            self.clock.advance_to(deadline)
            return TimedOut()
        return StreamEnd() if stream.end == "eof" else ConnectFailed("reset")

    def relay_reads(self, handle: Any, relay: Relay) -> bool:
        return False  # scripted reads all go through next_chunk

    def close_stream(self, handle: Any) -> None:
        if handle is not None:
            handle.closed = True
            self.closed.append(handle)

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        self.released.append((producer_url, descriptor))


class RecordingSink:
    """A client: records what it was sent; may leave after ``leave_after_sends`` sends.

    ``blocked`` scripts a client that does not read: write number *i* (respond, commit and send
    counted together, from 0) waits ``blocked[i]`` seconds for the client to make room,
    advancing ``clock``; a write that would still wait past its deadline times out there, and
    the sink writes nothing after that (as the live sink).
    """

    def __init__(
        self,
        leave_after_sends: int | None = None,
        blocked: dict[int, float] | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body: dict[str, Any] | None = None
        self.events: list[bytes] = []
        self.ended = False  # end() was called: the body is over
        self.leave_after_sends = leave_after_sends
        self.blocked = dict(blocked or {})
        self.clock = clock
        self.writes = 0  # write calls so far
        self.deadlines: list[float] = []  # the deadline of each write call
        self.timed_out_at: float | None = None  # when a write timed out (the sink is cut)

    def _wait(self, deadline: float) -> TimedOut | None:
        """Wait as scripted for write number ``self.writes``; TimedOut if past ``deadline``."""
        index = self.writes
        self.writes += 1
        self.deadlines.append(deadline)
        if self.timed_out_at is not None:
            return TimedOut()
        block = self.blocked.get(index, 0.0)
        if block <= 0:
            return None
        assert self.clock is not None, "a blocking client needs the clock"
        if self.clock.t + block > deadline:
            self.clock.advance_to(max(self.clock.t, deadline))
            self.timed_out_at = self.clock.t
            return TimedOut()
        self.clock.advance_to(self.clock.t + block)
        return None

    async def respond(
        self, status: int, body: dict[str, Any], headers: dict[str, str], deadline: float
    ) -> TimedOut | None:
        assert self.status is None, "respond after the response started"
        if (waited := self._wait(deadline)) is not None:
            return waited
        self.status, self.body, self.headers = status, body, headers
        return None

    async def commit(self, headers: dict[str, str], deadline: float) -> TimedOut | None:
        assert self.status is None
        if (waited := self._wait(deadline)) is not None:
            return waited
        self.status, self.headers = 200, headers
        return None

    async def send(self, data: bytes, deadline: float) -> TimedOut | None:
        assert self.status == 200, "send before commit"
        assert not self.ended, "send after end"
        if self.leave_after_sends is not None and len(self.events) >= self.leave_after_sends:
            raise ClientGone()
        if (waited := self._wait(deadline)) is not None:
            return waited
        self.events.append(data)
        return None

    def send_now(self, data: bytes) -> bool:
        return False  # every write goes through send, where the script applies

    async def end(self, data: bytes, deadline: float) -> TimedOut | None:
        """The stream's last bytes: a send, after which nothing more may be sent."""
        waited = await self.send(data, deadline)
        self.ended = True
        return waited

    def sse_events(self) -> list[bytes]:
        """What the client received, cut into SSE events (one write may carry several)."""
        return [event + b"\n\n" for event in b"".join(self.events).split(b"\n\n")[:-1]]

    def data_events(self) -> list[Any]:
        out: list[Any] = []
        for raw in self.sse_events():
            text = raw.decode().removeprefix("data: ").strip()
            out.append(text if text == "[DONE]" else json.loads(text))
        return out


def make_ports(clock: VirtualClock, transport: ScriptedTransport) -> Ports:
    spawned: list[Any] = []
    ports = Ports(clock=clock, transport=transport, spawn=spawned.append)
    return ports
