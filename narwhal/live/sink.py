"""The live client sink: the core's :class:`~narwhal.core.ports.ClientSink` over ASGI ``send``.

Rule kept here: the sink only writes what the core tells it to, in ASGI's order (one
``http.response.start``, then body messages), and turns a departed client into
:class:`~narwhal.core.ports.ClientGone`; it decides nothing about statuses or content.

Theory of operation: :meth:`AsgiSink.respond` sends a complete JSON response; :meth:`commit`
sends HTTP 200 with the SSE headers (the commit point) and :meth:`send` streams body bytes after
it; :meth:`finish` ends a committed body. A watcher (see :func:`run_with_disconnect`) reads
``receive()`` concurrently; on ``http.disconnect`` it marks the sink gone and cancels the
request's scope, so the core's lifecycle is cancelled and releases what it holds in
``finally``. A disconnect reported after the response was complete is normal and ignored.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Receive, Send

from narwhal.core.ports import ClientGone

T = TypeVar("T")


def _header_list(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


class AsgiSink:
    """Writes one HTTP response to an ASGI ``send``."""

    def __init__(self, send: Send, extra_headers: dict[str, str] | None = None) -> None:
        self._send = send
        self._extra = dict(extra_headers or {})
        self.gone = False
        self.started = False  # http.response.start sent
        self.finished = False  # the last body message sent
        self.status: int | None = None

    async def _emit(self, message: dict[str, Any]) -> None:
        if self.gone:
            raise ClientGone()
        try:
            await self._send(message)
        except OSError as error:
            self.gone = True
            raise ClientGone() from error

    async def respond(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        if self.started:
            raise RuntimeError("respond() after the response started")
        payload = json.dumps(body).encode()
        all_headers = {
            **self._extra,
            **headers,
            "content-type": "application/json",
            "content-length": str(len(payload)),
        }
        self.started, self.status = True, status
        await self._emit(
            {"type": "http.response.start", "status": status, "headers": _header_list(all_headers)}
        )
        self.finished = True
        await self._emit({"type": "http.response.body", "body": payload, "more_body": False})

    async def commit(self, headers: dict[str, str]) -> None:
        if self.started:
            raise RuntimeError("commit() after the response started")
        self.started, self.status = True, 200
        await self._emit(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _header_list({**self._extra, **headers}),
            }
        )

    async def send(self, data: bytes) -> None:
        # _emit inlined: this runs once per streamed chunk
        if self.gone:
            raise ClientGone()
        try:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})
        except OSError as error:
            self.gone = True
            raise ClientGone() from error

    async def finish(self) -> None:
        """End a committed body (no-op when the response is already complete or never began)."""
        if self.started and not self.finished and not self.gone:
            self.finished = True
            with contextlib.suppress(ClientGone):
                await self._emit({"type": "http.response.body", "body": b"", "more_body": False})


async def run_with_disconnect(
    receive: Receive, sink: AsgiSink, work: Callable[[], Awaitable[T]]
) -> T | None:
    """Run ``work()``; cancel it when the client disconnects first (then return None)."""
    result: list[T] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not sink.finished:
                        sink.gone = True
                        group.cancel_scope.cancel()
                    return

        group.start_soon(watch)
        result.append(await work())
        group.cancel_scope.cancel()
    return result[0] if result else None
