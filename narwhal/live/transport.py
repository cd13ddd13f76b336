"""The live transport: the core's :class:`~narwhal.core.ports.Transport` port over aiohttp.

Rule kept here: every method returns a result value (``Reply``, ``StreamOpened``, ``Chunk``,
``StreamEnd``, ``ConnectFailed``, ``TimedOut``) and never raises for an engine fault; it makes no
decision about what a result means (that is the core's job).

Theory of operation: one ``aiohttp.ClientSession`` over one ``TCPConnector`` (HTTP/1.1,
keep-alive pool bounded by ``max_connections``, the C parser) serves every engine. The session
has no timeouts of its own (Narwhal's deadlines rule), no cookie jar, no environment proxies, and
no response decoding (``Accept-Encoding`` is not sent, so engines answer in identity, and SSE is
never encoded). A deadline is an absolute time on the clock, kept on the time the router's event
loop was running (:mod:`narwhal.live.waits`: the router's own stalls, measured by its lag monitor,
push a pending deadline back, so a reply that arrived during a stall is read before the deadline
is judged). :meth:`call` and :meth:`open_stream` run under :func:`~narwhal.live.waits.deadline_at`
(expiry becomes ``TimedOut()``). :meth:`next_chunk` runs once per streamed chunk, so each stream
has one :class:`~narwhal.live.waits.ReadDeadline`: one loop timer, re-armed only when the
deadline moves earlier, that ends a read outlasting its deadline by setting an exception on the
stream's reader (no task is cancelled; another cancellation simply propagates). A chunk is
whatever the reader holds when the read returns (``readany``): several engine writes that
arrived together are one chunk. ``aiohttp.ClientConnectorError`` maps to
``ConnectFailed("refused")``, any other client or socket error (read, write, protocol) to
``ConnectFailed("reset")``. A stream whose status is not 200 is read whole (up to
``MAX_REPLY_BYTES + 1`` bytes) into ``StreamOpened.body`` and closed at once.

Closing must be synchronous (the core calls :meth:`close_stream` and :meth:`release_handoff`
from ``finally`` blocks, possibly in a cancelled task), so neither awaits anything. A stream read
to its end gives its connection back to the pool at once; one with unread bytes waiting (the
engine is still streaming) is closed at once, which is how the engine learns that the request
was abandoned (vLLM aborts it). Any other (just after ``[DONE]`` only the end of the chunked
body is left) is drained: it stays open for up to ``DRAIN_S`` (its reader's flow control bounds
what it buffers meanwhile); if the body ends in time the connection goes back to the pool, else
it is closed. A drain is a loop timer, not a task.
``release_handoff`` POSTs the descriptor to ``<producer>/kv/release`` (Narwhal's emulator serves
it; a real vLLM has no such endpoint) in a task the transport owns, bounded by
``BACKGROUND_TIMEOUT_S``: an engine that answers 404/405 is remembered and never asked again, and
every error is ignored. The transport is an async context manager: leaving it closes the open
streams and pending drains, waits for the release tasks (each bounded) and closes the session.
Used without ``async with`` (e.g. by ``EngineClient.http``), the session is created on first use;
call :meth:`aclose` when done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from types import TracebackType
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

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
from narwhal.live.waits import DeadlinePassed, ReadDeadline, deadline_at

RELEASE_PATH = "/kv/release"
BACKGROUND_TIMEOUT_S = 2.0
DRAIN_S = 0.1
MAX_CACHED_URLS = 1024

# An idle pooled connection is dropped after this long, well before the engines' servers close
# it (uvicorn's and vLLM's keep-alive timeout is 5 s): with equal timeouts a health check every
# 5 s raced the server's close, read a reset and ejected a healthy engine (seen on the real vLLM
# pair: 9 of 40 requests answered 503 "no engine").
KEEPALIVE_EXPIRY_S = 2.0

ENGINE_ERRORS = (aiohttp.ClientError, HttpProcessingError, OSError)
"""What a call to an engine can raise for the engine's (or the network's) fault: aiohttp's
client errors, a response it cannot parse, a socket error."""


def encode_json(body: Any) -> bytes:
    """A JSON request body: compact, UTF-8, no NaN."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _failure(error: BaseException) -> ConnectFailed:
    if isinstance(error, aiohttp.ClientConnectorError):
        return ConnectFailed("refused")
    return ConnectFailed("reset")


async def _read_bounded(response: aiohttp.ClientResponse) -> bytes:
    """The whole body, or its first ``MAX_REPLY_BYTES + 1`` bytes: the core refuses a longer
    reply, and holding the rest of a runaway one would only exhaust memory (the caller closes
    a response left unread, which drops its connection)."""
    parts: list[bytes] = []
    held = 0
    content = response.content
    while held <= MAX_REPLY_BYTES:
        data = await content.readany()
        if not data:
            break
        parts.append(data)
        held += len(data)
    return b"".join(parts)[: MAX_REPLY_BYTES + 1]


def _finish(response: aiohttp.ClientResponse) -> None:
    """Give a response's connection back to the pool if its body came to its end, else drop
    the connection."""
    if response.content.is_eof():
        response.release()
    else:
        response.close()


def _unread(content: aiohttp.StreamReader) -> bool:
    """Whether body bytes the core has not read are waiting (they are dropped)."""
    try:
        return bool(content.read_nowait())
    except RuntimeError:  # a read is still waiting on it: nothing is buffered
        return False


class AioStream:
    """An open upstream stream (the core's opaque stream handle)."""

    __slots__ = ("closed", "connection_lost", "content", "deadline", "response")

    def __init__(self, response: aiohttp.ClientResponse, deadline: ReadDeadline) -> None:
        self.response = response
        self.content = response.content
        self.deadline = deadline  # ends a read that outlasts its deadline
        self.closed = False
        # aiohttp's C parser does not tell the body's reader when a malformed body makes it drop
        # the connection (the read would wait for its deadline): the loss ends the read instead.
        protocol = response.connection.protocol if response.connection is not None else None
        self.connection_lost = protocol.closed if protocol is not None else None
        if self.connection_lost is not None:
            self.connection_lost.add_done_callback(self._lost)

    def _lost(self, _: object) -> None:
        content = self.content
        if not content.is_eof() and content.exception() is None:
            content.set_exception(aiohttp.ClientPayloadError("connection lost mid-body"))

    def unwatch(self) -> None:
        if self.connection_lost is not None:
            self.connection_lost.remove_done_callback(self._lost)
            self.connection_lost = None

    @property
    def status(self) -> int:
        return self.response.status


class AiohttpTransport:
    """Engine calls over one pooled ``aiohttp.ClientSession``; use as ``async with``."""

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
        self._max_connections = max_connections
        self._keepalive_expiry_s = keepalive_expiry_s
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._no_release: set[str] = set()
        self._open: set[AioStream] = set()  # handed to the core, not closed yet
        self._draining: dict[AioStream, asyncio.TimerHandle] = {}  # closed, body not at its end
        self._releases: set[asyncio.Task[None]] = set()  # owned: awaited by aclose()
        self._closing = False  # aclose() began: no new release is started

    async def __aenter__(self) -> AiohttpTransport:
        _ = self.session
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the open streams and pending drains (dropping their connections), wait for the
        release tasks (each bounded), then close the connection pool."""
        self._closing = True
        for stream in list(self._open):
            self.close_stream(stream)
        for stream, cut in list(self._draining.items()):
            cut.cancel()
            self._cut(stream)
        try:
            if self._releases:
                await asyncio.gather(*self._releases, return_exceptions=True)
        finally:
            if self._session is not None:
                session, self._session = self._session, None
                await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                keepalive_timeout=self._keepalive_expiry_s,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(),  # none: the deadlines are Narwhal's
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    def _url(self, url: str) -> URL:
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= MAX_CACHED_URLS:
                self._urls.clear()
            parsed = self._urls[url] = URL(url)
        return parsed

    async def _send(
        self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        if body is None:
            return await self.session.request(method, self._url(url), headers=headers)
        headers = {**headers, "Content-Type": "application/json"}
        return await self.session.request(
            method, self._url(url), headers=headers, data=encode_json(body)
        )

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
        try:
            async with deadline_at(self._clock, self._stalls, deadline):
                response = await self._send(method, url + path, body, headers)
                try:
                    content = await _read_bounded(response)
                finally:
                    _finish(response)
        except TimeoutError:
            return TimedOut()
        except ENGINE_ERRORS as error:
            return _failure(error)
        names = tuple((name.lower(), value) for name, value in response.headers.items())
        return Reply(response.status, content, names)

    async def open_stream(
        self,
        url: str,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        deadline: float,
    ) -> OpenResult:
        stream: AioStream | None = None
        result: OpenResult = TimedOut()
        try:
            async with deadline_at(self._clock, self._stalls, deadline):
                response = await self._send("POST", url + path, body, headers)
                stream = AioStream(response, ReadDeadline(self._clock, self._stalls))
                self._open.add(stream)
                if stream.status == 200:
                    result = StreamOpened(stream, 200)
                else:
                    result = StreamOpened(stream, stream.status, await _read_bounded(response))
        except TimeoutError:
            result = TimedOut()
        except ENGINE_ERRORS as error:
            result = _failure(error)
        finally:
            # Only a 200 stream is the caller's to close. Anything else is closed here, even
            # when the request is cancelled mid-way (the client left while an error body was
            # being read): its connection would otherwise stay open until shutdown.
            handed_over = isinstance(result, StreamOpened) and result.status == 200
            if stream is not None and not handed_over:
                self.close_stream(stream)
        return result

    async def next_chunk(self, handle: Any, deadline: float) -> ChunkResult:
        stream: AioStream = handle
        if stream.closed:
            return StreamEnd()
        content = stream.content
        timer = stream.deadline
        timer.wait_begins(deadline, content)
        try:
            data = await content.readany()
        except DeadlinePassed:
            return TimedOut()
        except ENGINE_ERRORS:
            return ConnectFailed("reset")
        finally:
            timer.wait_ends()
        if not data:
            return StreamEnd()
        return Chunk(data)

    def close_stream(self, handle: Any) -> None:
        stream: AioStream = handle
        if stream.closed:
            return
        stream.closed = True
        stream.deadline.disarm()
        stream.unwatch()
        self._open.discard(stream)
        content = stream.content
        if content.is_eof() or content.exception() is not None:
            _finish(stream.response)
            return
        if _unread(content):  # the engine is still streaming: abandon it now
            stream.response.close()
            return
        # Wait (bounded) for the end of the body: at its end the response gives its connection
        # back to the pool by itself; if it has not ended by then, the connection is dropped.
        self._draining[stream] = asyncio.get_running_loop().call_later(DRAIN_S, self._cut, stream)
        content.on_eof(lambda: self._drained(stream))

    def _drained(self, stream: AioStream) -> None:
        cut = self._draining.pop(stream, None)
        if cut is not None:
            cut.cancel()
        _finish(stream.response)

    def _cut(self, stream: AioStream) -> None:
        self._draining.pop(stream, None)
        stream.response.close()

    def release_handoff(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        if producer_url in self._no_release or self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._release(producer_url, descriptor))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, producer_url: str, descriptor: dict[str, Any]) -> None:
        with contextlib.suppress(TimeoutError, *ENGINE_ERRORS):
            async with asyncio.timeout(BACKGROUND_TIMEOUT_S):
                body = {"kv_transfer_params": descriptor}
                response = await self._send("POST", producer_url + RELEASE_PATH, body, {})
                try:
                    await _read_bounded(response)
                finally:
                    _finish(response)
                if response.status in (404, 405):
                    self._no_release.add(producer_url)
