"""The client sink over real HTTP on loopback (the router's edge server, on uvloop): a write
still blocked at its deadline returns ``TimedOut`` near that deadline with no task cancelled and
the connection cut at once (not held until the client reads), a cut is not mistaken for the
client leaving, a client that leaves cancels the work, and a cancellation from anyone else (a
shutdown's, a timeout around it) propagates.

Each test runs the server and a raw-socket client in one event loop. The client advertises a
small receive window and does not read, so the server's writes block after kilobytes (the
server's kernel send buffer is kept small too); every wait for an outcome is bounded."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from narwhal.core.config import ClientSettings
from narwhal.core.ports import ClientGone, TimedOut
from narwhal.live.h1request import EdgeRequest, Response
from narwhal.live.h1server import EdgeServer
from narwhal.live.sink import CancelledOnDisconnect, ResponseSink
from narwhal.serving import bind, port_of

SMALL_BUFFER = 8192
CHUNK = b"x" * 4096
WRITE_TIMEOUT_S = 0.3
REQUEST = b"GET /stream HTTP/1.1\r\nhost: test\r\n\r\n"

Handler = Callable[[EdgeRequest], Awaitable[Response | None]]


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(asyncio.wait_for(main(), 10))


Client = Callable[[socket.socket, EdgeServer], Awaitable[None]]


async def serve_one(handler: Handler, client: Client) -> None:
    """Serve ``handler`` on a loopback port while ``client`` runs on a raw socket to it."""
    sock = bind("127.0.0.1", 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)  # accepted ones inherit
    edge = EdgeServer(handler, ClientSettings())
    listening = await asyncio.get_running_loop().create_server(edge, sock=sock)
    peer = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER // 2)
    peer.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(peer, ("127.0.0.1", port_of(sock)))
        await asyncio.get_running_loop().sock_sendall(peer, REQUEST)
        await client(peer, edge)
    finally:
        peer.close()
        listening.close()
        await edge.shutdown(0.1)


async def read_to_end(peer: socket.socket, limit_s: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    loop, received = asyncio.get_running_loop(), b""
    async with asyncio.timeout(limit_s):
        while data := await loop.sock_recv(peer, 65536):
            received += data
    return received


def test_a_write_blocked_past_its_deadline_is_cut_not_cancelled() -> None:
    seen: dict[str, Any] = {}
    handled = asyncio.Event()

    async def handler(request: EdgeRequest) -> Response | None:
        sink = ResponseSink(request)

        async def work() -> str:
            assert await sink.commit({"content-type": "text/event-stream"}) is None
            while True:
                began = time.monotonic()
                result = await sink.send(CHUNK, began + WRITE_TIMEOUT_S)
                if result is not None:
                    seen["blocked_s"] = time.monotonic() - began
                    seen["result"] = result
                    seen["after"] = await sink.send(CHUNK, time.monotonic() + 60)
                    return "cut"

        async with CancelledOnDisconnect(request.closed, sink) as scope:
            seen["work"] = await work()
        seen["cut"], seen["gone"], seen["left"] = sink.cut, sink.gone, scope.left
        handled.set()
        sink.done()
        return None

    async def client(peer: socket.socket, edge: EdgeServer) -> None:
        async with asyncio.timeout(5):
            await handled.wait()
            while edge.counts.open:  # freed at the cut, not when the client reads
                await asyncio.sleep(0.01)
        body = await read_to_end(peer)  # what reached the kernel's buffers, then the close
        assert body.startswith(b"HTTP/1.1 200")
        assert not body.endswith(b"\r\n0\r\n\r\n")  # never ended as if whole

    run(lambda: serve_one(handler, client))
    assert isinstance(seen["result"], TimedOut) and isinstance(seen["after"], TimedOut)
    assert WRITE_TIMEOUT_S <= seen["blocked_s"] < WRITE_TIMEOUT_S + 1.0
    assert seen["work"] == "cut"  # the cut's own close did not cancel the work as a disconnect
    assert seen["cut"] and not seen["gone"] and not seen["left"]


def test_a_client_that_leaves_cancels_the_work() -> None:
    seen: dict[str, Any] = {}
    handled, committed = asyncio.Event(), asyncio.Event()

    async def handler(request: EdgeRequest) -> Response | None:
        sink = ResponseSink(request)

        async def work() -> str:
            await sink.commit({"content-type": "text/event-stream"})
            committed.set()
            try:
                await asyncio.Event().wait()  # an engine that says nothing more
            except asyncio.CancelledError:
                seen["cancelled"] = True
                raise
            return "never"

        seen["work"] = None
        async with CancelledOnDisconnect(request.closed, sink) as scope:
            seen["work"] = await work()
        seen["gone"], seen["left"] = sink.gone, scope.left
        with pytest.raises(ClientGone):
            await sink.send(CHUNK, time.monotonic() + 1)
        handled.set()
        sink.done()
        return None

    async def client(peer: socket.socket, edge: EdgeServer) -> None:
        async with asyncio.timeout(5):
            await committed.wait()
        peer.close()
        async with asyncio.timeout(5):
            await handled.wait()

    run(lambda: serve_one(handler, client))
    assert seen == {"cancelled": True, "work": None, "gone": True, "left": True}


@pytest.mark.parametrize("source", ["outer timeout", "work's own"])
def test_another_cancellation_or_timeout_propagates(source: str) -> None:
    seen: dict[str, Any] = {}
    handled = asyncio.Event()

    async def handler(request: EdgeRequest) -> Response | None:
        sink = ResponseSink(request)

        async def work() -> None:
            if source == "work's own":
                raise TimeoutError("the work's own")
            await asyncio.Event().wait()

        try:
            async with asyncio.timeout(0.1):  # as a shutdown's cancellation would
                async with CancelledOnDisconnect(request.closed, sink):
                    await work()
        except TimeoutError as error:
            seen["raised"] = str(error)
        seen["gone"] = sink.gone
        await sink.respond(503, {"error": "stopped"}, {}, time.monotonic() + 1)
        handled.set()
        sink.done()
        return None

    async def client(peer: socket.socket, edge: EdgeServer) -> None:
        async with asyncio.timeout(5):
            await handled.wait()
        loop, received = asyncio.get_running_loop(), b""
        async with asyncio.timeout(5):
            while b"stopped" not in received:
                data = await loop.sock_recv(peer, 65536)
                assert data, "closed before the answer"
                received += data
        assert received.startswith(b"HTTP/1.1 503")

    run(lambda: serve_one(handler, client))
    assert seen == {"raised": "the work's own" if source == "work's own" else "", "gone": False}


def counted_writes(request: EdgeRequest) -> list[bytes]:
    """Every ``transport.write`` of ``request``'s connection from now on, one entry per call
    (one send each on an idle socket). Needs asyncio's own loop: uvloop's transport is a C type
    whose ``write`` cannot be wrapped."""
    transport = request.conn.transport
    assert transport is not None
    writes: list[bytes] = []
    write = transport.write

    def counting(data: Any) -> None:
        writes.append(bytes(data))
        write(data)

    transport.write = counting  # type: ignore[method-assign]
    return writes


async def read_until(peer: socket.socket, end: bytes, limit_s: float = 5.0) -> bytes:
    loop, received = asyncio.get_running_loop(), b""
    async with asyncio.timeout(limit_s):
        while not received.endswith(end):
            data = await loop.sock_recv(peer, 65536)
            assert data, f"closed before {end!r}: {received!r}"
            received += data
    return received


def test_the_head_goes_with_the_first_token_and_the_end_with_the_last() -> None:
    seen: dict[str, Any] = {}

    async def handler(request: EdgeRequest) -> Response | None:
        sink = ResponseSink(request)
        seen["writes"] = writes = counted_writes(request)
        assert await sink.commit({"content-type": "text/event-stream"}) is None
        seen["after_commit"] = len(writes)  # the head is held, not written
        assert sink.started and await sink.send(b"data: a\n\n") is None
        assert await sink.end(b"data: [DONE]\n\n") is None
        seen["finished"] = sink.finished
        await sink.finish()  # the body is already whole: nothing more
        sink.done()
        return None

    async def client(peer: socket.socket, edge: EdgeServer) -> None:
        seen["body"] = await read_until(peer, b"\r\n0\r\n\r\n")

    with asyncio.Runner() as runner:
        runner.run(asyncio.wait_for(serve_one(handler, client), 10))
    head_and_token, last_and_end = seen["writes"]
    assert seen["after_commit"] == 0 and seen["finished"]
    assert head_and_token.startswith(b"HTTP/1.1 200")
    assert head_and_token.endswith(b"\r\n\r\n9\r\ndata: a\n\n\r\n")  # the head, then the token
    assert last_and_end == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    assert seen["body"] == head_and_token + last_and_end


def test_a_held_head_reaches_the_client_when_the_stream_ends_before_any_body() -> None:
    async def handler(request: EdgeRequest) -> Response | None:
        sink = ResponseSink(request)
        assert await sink.commit({"content-type": "text/event-stream"}) is None
        sink.done()  # incomplete: the connection is closed after the head
        return None

    async def client(peer: socket.socket, edge: EdgeServer) -> None:
        body = await read_to_end(peer)
        assert body.startswith(b"HTTP/1.1 200") and body.endswith(b"\r\n\r\n")
        assert b"text/event-stream" in body and not body.endswith(b"0\r\n\r\n")

    run(lambda: serve_one(handler, client))
