"""The emulator's small ASGI exchanges: whole replies, the request body, disconnect watching.

Rule kept here: the emulator reads a request's whole body before it acts (so that afterwards
``receive()`` yields nothing but the client's disconnect), and a request whose client leaves is
cancelled, wherever its work is: that is how a hang ends when the router gives up.

Theory of operation: :func:`read_body` collects ``http.request`` messages (None when the client
left first). :func:`watched` runs the work beside a watcher of ``receive()``; whichever ends
first cancels the other, and ``on_abort`` is called when the client left before the work said
its response was complete. :func:`reply` and the helpers after it send a whole response.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.types import Message, Receive, Send

from narwhal.core import wire

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
NOT_FOUND = {"detail": "Not Found"}  # the body vLLM's server (FastAPI) gives an unknown path


async def reply(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole response with a content length."""
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def json_reply(send: Send, status: int, payload: Any) -> None:
    await reply(send, status, json.dumps(payload).encode(), JSON_HEADERS)


async def bytes_reply(send: Send, status: int, body: bytes) -> None:
    """A JSON body already encoded (the wire module's shapes)."""
    await reply(send, status, body, JSON_HEADERS)


async def error_reply(send: Send, status: int, message: str) -> None:
    """An OpenAI error body, as vLLM answers before streaming."""
    await bytes_reply(send, status, wire.error_body(status, message))


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client left first."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def watched(
    receive: Receive, work: Callable[[], Awaitable[bool]], on_abort: Callable[[], None]
) -> None:
    """Run ``work`` (it returns True once its response is complete); a disconnect cancels it."""
    finished = False
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    if not finished:
                        on_abort()
                        group.cancel_scope.cancel()
                    return

        async def run() -> None:
            nonlocal finished
            finished = await work()
            group.cancel_scope.cancel()

        group.start_soon(watch)
        group.start_soon(run)
