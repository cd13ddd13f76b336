"""The edge server's HTTP/1.1 over raw loopback sockets, with small handlers in the server's own
event loop (uvloop): pipelined requests answered one at a time and in order, HEAD, HTTP/1.0
keep-alive, ``expect: 100-continue``, a malformed request, a handler that fails, header lookup
and paths, write flow control, and the shutdown's grace period. (The ``[client]`` bounds with the
whole router behind them are tests/live/test_edge_*.py and test_headlimit.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from narwhal.core.config import ClientSettings
from narwhal.live.h1request import EdgeRequest, Response
from narwhal.live.h1server import EdgeServer
from narwhal.serving import bind, port_of

Handler = Callable[[EdgeRequest], Awaitable[Response | None]]
Client = Callable[[socket.socket, EdgeServer], Awaitable[Any]]


def run(handler: Handler, client: Client, **settings: Any) -> Any:
    """Serve ``handler`` on loopback while ``client`` runs on a raw socket to it."""

    async def main() -> Any:
        sock = bind("127.0.0.1", 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)  # accepted ones inherit
        edge = EdgeServer(handler, ClientSettings(**settings))
        loop = asyncio.get_running_loop()
        listening = await loop.create_server(edge, sock=sock)
        peer = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        peer.setblocking(False)
        try:
            await loop.sock_connect(peer, ("127.0.0.1", port_of(sock)))
            return await client(peer, edge)
        finally:
            peer.close()
            listening.close()
            await edge.shutdown(0.1)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(asyncio.wait_for(main(), 10))


async def read_until(peer: socket.socket, done: Callable[[bytes], bool]) -> bytes:
    """What the server sends until ``done`` holds or it closes the connection."""
    loop, received = asyncio.get_running_loop(), b""
    async with asyncio.timeout(5):
        while not done(received):
            data = await loop.sock_recv(peer, 65536)
            if not data:
                break
            received += data
    return received


async def send(peer: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(peer, data)


def get(path: str, version: str = "1.1", extra: str = "") -> bytes:
    return f"GET {path} HTTP/{version}\r\nhost: x\r\n{extra}\r\n".encode()


async def echo_path(request: EdgeRequest) -> Response:
    return Response(200, request.path.encode(), {"content-type": "text/plain"})


def test_pipelined_requests_are_answered_one_at_a_time_in_order() -> None:
    running: list[str] = []
    most = 0

    async def handler(request: EdgeRequest) -> Response:
        nonlocal most
        running.append(request.path)
        most = max(most, len(running))
        await asyncio.sleep(0.02 if request.path == "/a" else 0)  # the first is the slowest
        running.remove(request.path)
        return await echo_path(request)

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        await send(peer, get("/a") + get("/b") + get("/c"))
        return await read_until(peer, lambda got: got.endswith(b"/c"))

    answers = run(handler, client)
    bodies = [part.rpartition(b"\r\n\r\n")[2] for part in answers.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"/a", b"/b", b"/c"] and most == 1


def test_head_is_answered_with_the_head_alone() -> None:
    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        await send(peer, b"HEAD /abc HTTP/1.1\r\nhost: x\r\n\r\n" + get("/next"))
        return await read_until(peer, lambda got: got.endswith(b"/next"))

    answers = run(echo_path, client)
    head, _, rest = answers.partition(b"\r\n\r\n")
    assert b"content-length: 4" in head and rest.startswith(b"HTTP/1.1 200 OK")


def test_an_http_1_0_client_asking_for_keep_alive_keeps_its_connection() -> None:
    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        ask = "connection: keep-alive\r\n"
        await send(peer, get("/one", "1.0", ask))
        first = await read_until(peer, lambda got: got.endswith(b"/one"))
        await send(peer, get("/two", "1.0"))  # no keep-alive asked: closed after it
        return first + await read_until(peer, lambda got: False)

    answers = run(echo_path, client)
    assert answers.startswith(b"HTTP/1.0 200 OK") and b"connection: keep-alive" in answers
    assert answers.endswith(b"/two") and answers.count(b"HTTP/1.0 200 OK") == 2


def test_a_body_expecting_100_continue_is_asked_for_at_its_first_read() -> None:
    async def handler(request: EdgeRequest) -> Response:
        body = b""
        while chunk := await request.readany():
            body += chunk
        return Response(200, body)

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        head = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n"
        await send(peer, head)
        interim = await read_until(peer, lambda got: got.endswith(b"\r\n\r\n"))
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await send(peer, b"hello")
        return await read_until(peer, lambda got: got.endswith(b"hello"))

    assert run(handler, client).startswith(b"HTTP/1.1 200 OK")


def test_a_malformed_request_is_a_400_error_object_and_a_close() -> None:
    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        await send(peer, b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
        return await read_until(peer, lambda got: False)

    answer = run(echo_path, client)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"connection: close" in head
    assert json.loads(body)["error"]["code"] == 400


@pytest.mark.parametrize(
    "framing",
    [
        b"content-length: 5\r\ntransfer-encoding: chunked\r\n",  # which one ends the body?
        b"content-length: 1\r\ncontent-length: 2\r\n",
        b"transfer-encoding: chunked, identity\r\n",
    ],
)
def test_a_request_whose_body_could_be_read_two_ways_is_refused(framing: bytes) -> None:
    """Request smuggling: a head whose body length two parsers could read differently is
    answered 400 and the connection closed, so no second request hides in its body."""
    seen: list[str] = []

    async def record(request: EdgeRequest) -> Response:
        seen.append(request.path)
        return await echo_path(request)

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        head = b"POST /first HTTP/1.1\r\nhost: x\r\n" + framing + b"\r\n"
        await send(peer, head + b"0\r\n\r\n" + get("/hidden"))
        return await read_until(peer, lambda got: False)

    answer = run(record, client)
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1") == 1
    assert seen == []


def test_a_handler_that_fails_is_a_500_error_object() -> None:
    async def handler(request: EdgeRequest) -> Response:
        raise RuntimeError("boom")

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        await send(peer, get("/"))
        return await read_until(peer, lambda got: got.endswith(b"}"))

    answer = run(handler, client)
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == 500


def test_headers_are_found_in_any_case_and_paths_are_decoded() -> None:
    seen: dict[str, Any] = {}

    async def handler(request: EdgeRequest) -> Response:
        seen.update(
            path=request.path,
            token=request.headers.get("X-TOKEN"),
            first=request.headers["x-twice"],
            has=("Host" in request.headers, "nope" in request.headers),
        )
        return Response(204)

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        extra = "X-Token: t\r\nx-twice: 1\r\nX-Twice: 2\r\n"
        await send(peer, get("/v1/%63ompletions?x=1", extra=extra))
        return await read_until(peer, lambda got: got.endswith(b"\r\n\r\n"))

    run(handler, client)
    assert seen == {"path": "/v1/completions", "token": "t", "first": "1", "has": (True, False)}


def test_a_stream_waits_while_its_client_does_not_read_and_resumes_when_it_does() -> None:
    piece = b"x" * 65536
    waited: list[bool] = []

    async def handler(request: EdgeRequest) -> None:
        request.hold_head(200, {"content-type": "text/plain"})
        for _ in range(32):  # 2 MiB: far more than the (small) socket buffers hold
            request.write(piece)
            waited.append(request.conn.writing_paused)
            await request.drain()
        request.write_eof()
        return None

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        await send(peer, get("/"))
        await asyncio.sleep(0.2)  # not reading: the server's writes back up
        return await read_until(peer, lambda got: got.endswith(b"\r\n0\r\n\r\n"))

    answer = run(handler, client)
    assert answer.count(piece) == 32 and any(waited)


def test_shutdown_closes_idle_connections_and_cancels_a_handler_after_the_grace() -> None:
    seen: dict[str, Any] = {}
    started = asyncio.Event()

    async def handler(request: EdgeRequest) -> Response:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return Response(200)

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        loop = asyncio.get_running_loop()
        idle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        idle.setblocking(False)
        await loop.sock_connect(idle, peer.getpeername())
        await send(peer, get("/"))
        async with asyncio.timeout(5):
            await started.wait()
        began = loop.time()
        await edge.shutdown(0.2)
        seen["waited_s"] = loop.time() - began
        try:
            seen["idle"] = await read_until(idle, lambda got: False)
        finally:
            idle.close()
        return await read_until(peer, lambda got: False)

    assert run(handler, client) == b""  # cancelled before any answer: closed
    # (uvloop's clock has millisecond steps: the grace may read as a hair under 0.2 s)
    assert seen["cancelled"] and seen["idle"] == b"" and 0.195 <= seen["waited_s"] < 1.0
