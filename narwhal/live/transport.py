"""The live transport: the core's :class:`~narwhal.core.ports.Transport` port over httpx.

Rule kept here: every method returns a result value (``Reply``, ``StreamOpened``, ``Chunk``,
``StreamEnd``, ``ConnectFailed``, ``TimedOut``) and never raises for an engine fault; it makes no
decision about what a result means (that is the core's job).

Theory of operation: one ``httpx.AsyncClient`` (HTTP/1.1, keep-alive pool, no timeouts of its
own) serves every engine. A deadline is an absolute time on the clock; each awaiting method
runs under ``anyio.move_on_after(deadline - now)``, and expiry becomes ``TimedOut()``.
``httpx.ConnectError`` maps to ``ConnectFailed("refused")``, any other transport error (read,
write, protocol) to ``ConnectFailed("reset")``. A stream whose status is not 200 is read whole
into ``StreamOpened.body`` and closed at once.

Closing must be synchronous (the core calls :meth:`close_stream` and :meth:`release_handoff`
from ``finally`` blocks, possibly inside a cancelled scope), so both only *schedule* work in the
transport's own task group, whose tasks are not affected by the caller's cancellation. Closing a
response that was not read to the end (after a short bounded drain, which lets a finished
response keep its connection) drops its connection, which is how the engine learns that
the request was abandoned (vLLM aborts it). The transport is an async context manager: leaving
it waits (bounded) for the scheduled closes and closes the client. Used without ``async with``
(e.g. by ``EngineClient.http``), the client is created on first use and the scheduled work runs
as plain asyncio tasks; call :meth:`aclose` when done.

``release_handoff`` POSTs the descriptor to ``<producer>/kv/release`` (Narwhal's emulator serves
it; a real vLLM has no such endpoint): an engine that answers 404/405 is remembered and never
asked again, and every error is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup

from narwhal.core.ports import (
    CallResult,
    Chunk,
    ChunkResult,
    Clock,
    ConnectFailed,
    OpenResult,
    Reply,
    StreamEnd,
    StreamOpened,
    TimedOut,
)

RELEASE_PATH = "/kv/release"
BACKGROUND_TIMEOUT_S = 2.0
DRAIN_S = 0.1
DRAIN_MAX_BYTES = 64 * 1024


class HttpStream:
    """An open upstream stream (the core's opaque stream handle)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.chunks: AsyncIterator[bytes] = response.aiter_raw()
        self.closed = False

    @property
    def status(self) -> int:
        return self.response.status_code


async def _drain(stream: HttpStream) -> None:
    """Read what little is left of a stream, so a finished response frees its connection.

    After ``[DONE]`` only the end of the chunked body is left: reading it lets httpx put the
    connection back in the keep-alive pool instead of dropping it (a new connection per request
    costs more CPU than the request). A stream that is not about to end (an abandoned or hung
    one) is cut after ``DRAIN_S`` or ``DRAIN_MAX_BYTES``, which aborts the engine request.
    """
    drained = 0
    with anyio.move_on_after(DRAIN_S):
        try:
            async for data in stream.chunks:
                drained += len(data)
                if drained > DRAIN_MAX_BYTES:
                    return
        except Exception:  # a reset, or a body already read: nothing left to reuse
            return


def _failure(error: httpx.HTTPError) -> ConnectFailed | TimedOut:
    if isinstance(error, httpx.TimeoutException):
        return TimedOut()
    if isinstance(error, httpx.ConnectError):
        return ConnectFailed("refused")
    return ConnectFailed("reset")


class HttpxTransport:
    """Engine calls over one pooled ``httpx.AsyncClient``; use as ``async with``."""

    def __init__(self, clock: Clock, *, max_connections: int = 1000) -> None:
        self._clock = clock
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client: httpx.AsyncClient | None = None
        self._tasks: TaskGroup | None = None
        self._no_release: set[str] = set()
        self._open: set[HttpStream] = set()
        self._loose: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HttpxTransport:
        _ = self.client
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for stream in list(self._open):
            self.close_stream(stream)
        tasks, self._tasks = self._tasks, None
        try:
            if tasks is not None:
                await tasks.__aexit__(None, None, None)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (after the scheduled background work, bounded)."""
        if self._loose:
            with anyio.move_on_after(BACKGROUND_TIMEOUT_S):
                await asyncio.gather(*self._loose, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None), limits=self._limits, http1=True, http2=False
            )
        return self._client

    def _timeout(self, deadline: float) -> float:
        return max(0.0, deadline - self._clock.now())

    def _background(self, job: Callable[[], Awaitable[None]]) -> None:
        async def bounded() -> None:
            with anyio.move_on_after(BACKGROUND_TIMEOUT_S, shield=True):
                with contextlib.suppress(Exception):
                    await job()

        if self._tasks is not None:
            self._tasks.start_soon(bounded)
            return
        task = asyncio.get_running_loop().create_task(bounded())  # no task group: plain task
        self._loose.add(task)
        task.add_done_callback(self._loose.discard)

    # ------------------------------------------------------------------ the port

    async def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        deadline: float,
    ) -> CallResult:
        with anyio.move_on_after(self._timeout(deadline)):
            try:
                response = await self.client.request(method, url + path, json=body, headers=headers)
            except httpx.HTTPError as error:
                return _failure(error)
            return Reply(response.status_code, response.content, tuple(response.headers.items()))
        return TimedOut()

    async def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> OpenResult:
        request = self.client.build_request("POST", url + path, json=body, headers=headers)
        stream: HttpStream | None = None
        result: OpenResult = TimedOut()
        with anyio.move_on_after(self._timeout(deadline)):
            try:
                stream = HttpStream(await self.client.send(request, stream=True))
                self._open.add(stream)
                if stream.status == 200:
                    result = StreamOpened(stream, 200)
                else:
                    body_bytes = await stream.response.aread()
                    result = StreamOpened(stream, stream.status, body_bytes)
            except httpx.HTTPError as error:
                result = _failure(error)
        if stream is not None and (not isinstance(result, StreamOpened) or result.status != 200):
            self.close_stream(stream)  # the core also closes non-200 handles: idempotent
        return result

    async def next_chunk(self, handle: Any, deadline: float) -> ChunkResult:
        stream: HttpStream = handle
        if stream.closed:
            return StreamEnd()
        with anyio.move_on_after(self._timeout(deadline)):
            try:
                data = await stream.chunks.__anext__()
            except StopAsyncIteration:
                return StreamEnd()
            except httpx.HTTPError as error:
                return _failure(error)
            return Chunk(data)
        return TimedOut()

    def close_stream(self, handle: Any) -> None:
        stream: HttpStream = handle
        if stream.closed:
            return
        stream.closed = True
        self._open.discard(stream)

        async def close() -> None:
            await _drain(stream)
            aclose = getattr(stream.chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            await stream.response.aclose()

        self._background(close)

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        if producer_url in self._no_release:
            return

        async def release() -> None:
            response = await self.client.post(
                producer_url + RELEASE_PATH, json={"kv_transfer_params": descriptor}
            )
            if response.status_code in (404, 405):
                self._no_release.add(producer_url)

        self._background(release)
