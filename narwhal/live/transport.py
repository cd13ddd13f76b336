"""The live transport: the core's :class:`~narwhal.core.ports.Transport` port over httpx.

Rule kept here: every method returns a result value (``Reply``, ``StreamOpened``, ``Chunk``,
``StreamEnd``, ``ConnectFailed``, ``TimedOut``) and never raises for an engine fault; it makes no
decision about what a result means (that is the core's job).

Theory of operation: one ``httpx.AsyncHTTPTransport`` (HTTP/1.1, keep-alive pool, no timeouts
of its own) serves every engine. The hot calls (:meth:`call`, :meth:`open_stream`) hand a
prebuilt ``httpx.Request`` straight to it: the JSON body encoded once as httpx's ``json=`` would,
the client's default headers, a cached parsed URL, and none of ``AsyncClient``'s per-request
machinery (cookie jar, auth and redirect hooks, timeout merging), which Narwhal does not use; the
``AsyncClient`` over the same pool serves the rest (``release_handoff``). Environment proxies are
not used (``trust_env=False``): engines are reached directly. A deadline is an absolute time on
the clock, kept on the time the router's event loop was running (:mod:`narwhal.live.waits`:
the router's own stalls, measured by its lag monitor, push a pending deadline back, so a reply
that arrived during a stall is read before the deadline is judged); :meth:`call` and
:meth:`open_stream` run under a :class:`~narwhal.live.waits.DeadlineScope`, and expiry becomes
``TimedOut()``. :meth:`next_chunk` runs once per streamed chunk, so it uses one
:class:`~narwhal.live.waits.WaitTimer` per stream instead of a cancel scope per read; a read it
ends becomes ``TimedOut()`` (a cancellation from anywhere else still propagates).
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
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, cast

import anyio
import httpx
from anyio.abc import TaskGroup

from narwhal.core.legs import MAX_REPLY_BYTES
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
from narwhal.core.stalls import StallLedger
from narwhal.live.waits import DeadlineScope, WaitTimer

RELEASE_PATH = "/kv/release"
BACKGROUND_TIMEOUT_S = 2.0
DRAIN_S = 0.1
DRAIN_MAX_BYTES = 64 * 1024
MAX_CACHED_URLS = 1024


def encode_json(body: Any) -> bytes:
    """A JSON request body, byte for byte what httpx sends for ``json=body``."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class HttpStream:
    """An open upstream stream (the core's opaque stream handle)."""

    __slots__ = ("chunks", "closed", "response", "timer")

    def __init__(self, response: httpx.Response, timer: WaitTimer) -> None:
        self.response = response
        # the raw body, straight from the transport's stream (no decoding: SSE is never encoded)
        stream = cast(httpx.AsyncByteStream, response.stream)
        self.chunks: AsyncIterator[bytes] = stream.__aiter__()
        self.closed = False
        self.timer = timer  # ends a read that outlasts its deadline

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
    if stream.response.is_closed:
        return  # read whole (a non-200 answer): its connection is back in the pool already
    drained = 0
    with anyio.move_on_after(DRAIN_S):
        try:
            async for data in stream.chunks:
                drained += len(data)
                if drained > DRAIN_MAX_BYTES:
                    return
        except Exception:  # a reset, or a body already read: nothing left to reuse
            return


async def _read_bounded(response: httpx.Response) -> bytes:
    """The whole body, or its first ``MAX_REPLY_BYTES + 1`` bytes: the core refuses a longer
    reply, and holding the rest of a runaway one would only exhaust memory (closing the
    response unread drops its connection)."""
    parts: list[bytes] = []
    held = 0
    async for data in response.aiter_bytes():
        parts.append(data)
        held += len(data)
        if held > MAX_REPLY_BYTES:
            break
    return b"".join(parts)[: MAX_REPLY_BYTES + 1]


def _failure(error: httpx.HTTPError) -> ConnectFailed | TimedOut:
    if isinstance(error, httpx.TimeoutException):
        return TimedOut()
    if isinstance(error, httpx.ConnectError):
        return ConnectFailed("refused")
    return ConnectFailed("reset")


# An idle pooled connection is dropped after this long, well before the engines' servers close
# it (uvicorn's and vLLM's keep-alive timeout is 5 s, which is also httpx's default expiry): with
# equal timeouts a health check every 5 s raced the server's close, read a reset and ejected a
# healthy engine (seen on the real vLLM pair: 9 of 40 requests answered 503 "no engine").
KEEPALIVE_EXPIRY_S = 2.0


class HttpxTransport:
    """Engine calls over one pooled ``httpx.AsyncClient``; use as ``async with``."""

    def __init__(
        self,
        clock: Clock,
        *,
        max_connections: int = 1000,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
        stalls: StallLedger | None = None,
    ) -> None:
        self._clock = clock
        self._stalls = stalls  # the router's stalls, which extend every deadline (None: exact)
        self._limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=keepalive_expiry_s,
        )
        self._client: httpx.AsyncClient | None = None
        self._http: httpx.AsyncHTTPTransport | None = None
        self._default_headers: dict[str, str] = {}
        self._urls: dict[str, httpx.URL] = {}
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
            self._http = httpx.AsyncHTTPTransport(limits=self._limits, http1=True, http2=False)
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None), transport=self._http, trust_env=False
            )
            self._default_headers = dict(self._client.headers)  # lower-case names
        return self._client

    @property
    def http(self) -> httpx.AsyncHTTPTransport:
        if self._http is None:
            _ = self.client
        assert self._http is not None
        return self._http

    def _request(
        self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> httpx.Request:
        """What ``AsyncClient.build_request(method, url, json=body, headers=headers)`` builds."""
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= MAX_CACHED_URLS:
                self._urls.clear()
            parsed = self._urls[url] = httpx.URL(url)
        merged = dict(self._default_headers)
        for name, value in headers.items():
            merged[name.lower()] = value
        if body is None:
            return httpx.Request(method, parsed, headers=merged)
        merged["content-type"] = "application/json"
        return httpx.Request(method, parsed, headers=merged, content=encode_json(body))

    def _scope(self, deadline: float) -> DeadlineScope:
        return DeadlineScope(self._clock, self._stalls, deadline)

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
        request = self._request(method, url + path, body, headers)
        with self._scope(deadline):
            try:
                response = await self.http.handle_async_request(request)
                response.request = request
                try:
                    content = await _read_bounded(response)
                finally:
                    await response.aclose()
            except httpx.HTTPError as error:
                return _failure(error)
            return Reply(response.status_code, content, tuple(response.headers.items()))
        return TimedOut()

    async def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> OpenResult:
        request = self._request("POST", url + path, body, headers)
        stream: HttpStream | None = None
        result: OpenResult = TimedOut()
        handed_over = False
        try:
            with self._scope(deadline):
                try:
                    response = await self.http.handle_async_request(request)
                    response.request = request
                    stream = HttpStream(response, WaitTimer(self._clock, self._stalls))
                    self._open.add(stream)
                    if stream.status == 200:
                        result = StreamOpened(stream, 200)
                    else:
                        body_bytes = await _read_bounded(stream.response)
                        result = StreamOpened(stream, stream.status, body_bytes)
                except httpx.HTTPError as error:
                    result = _failure(error)
            handed_over = isinstance(result, StreamOpened) and result.status == 200
            return result
        finally:
            # Only a 200 stream is the caller's to close. Anything else is closed here, even
            # when the request is cancelled mid-way (the client left while an error body was
            # being read): its connection would otherwise stay open until shutdown.
            if stream is not None and not handed_over:
                self.close_stream(stream)

    async def next_chunk(self, handle: Any, deadline: float) -> ChunkResult:
        stream: HttpStream = handle
        if stream.closed:
            return StreamEnd()
        timer = stream.timer
        task = timer.begin(deadline)
        cancelling = task.cancelling()
        try:
            data = await stream.chunks.__anext__()
        except StopAsyncIteration:
            return StreamEnd()
        except httpx.HTTPError as error:
            return _failure(error)
        except asyncio.CancelledError:
            if timer.timed_out(task, cancelling):  # our timer's, and nobody else's
                return TimedOut()
            raise
        finally:
            timer.end()
        return Chunk(data)

    def close_stream(self, handle: Any) -> None:
        stream: HttpStream = handle
        if stream.closed:
            return
        stream.closed = True
        stream.timer.disarm()
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
