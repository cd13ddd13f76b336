"""The HTTP/1.1 engine client against raw asyncio servers on 127.0.0.1: a connection is reused
only after a whole keep-alive response, every buffer has its bound (the head at exactly
``MAX_HEAD_BYTES``, the unread body at ``HIGH_WATER``), a body without a length ends with its
connection and any other lost body is a failure, and the pool never holds more than its limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from narwhal.live.h1client import (
    HIGH_WATER,
    MAX_HEAD_BYTES,
    H1Connection,
    H1Pool,
    Origin,
    request_bytes,
)
from narwhal.live.h1errors import ConnectionLost, EngineProtocolError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(handler: Handler) -> tuple[asyncio.Server, Origin]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, Origin.of(f"http://127.0.0.1:{port}")


async def answer_each(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: bytes
) -> None:
    """Answer every request on the connection with ``response``, until the client closes."""
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def get(pool: H1Pool, origin: Origin) -> tuple[H1Connection, bytes]:
    conn = await pool.acquire(origin)
    conn.send(request_bytes("GET", origin, "/x", {}, None))
    await conn.head()
    body = b""
    while data := await conn.readany():
        body += data
    return conn, body


def run(main: Callable[[], Awaitable[object]]) -> object:
    return asyncio.run(asyncio.wait_for(main(), 10))


def test_a_whole_keepalive_response_reuses_its_connection_and_a_close_does_not() -> None:
    async def main() -> tuple[bool, bool, bytes]:
        server, origin = await serve(lambda r, w: answer_each(r, w, OK))
        closing = OK.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")
        server2, origin2 = await serve(lambda r, w: answer_each(r, w, closing))
        pool = H1Pool(10, 5.0)
        first, body = await get(pool, origin)
        pool.release(first)
        second, _ = await get(pool, origin)
        pool.release(second)
        third, _ = await get(pool, origin2)
        pool.release(third)
        fourth, _ = await get(pool, origin2)
        pool.release(fourth)
        pool.close()
        server.close()
        server2.close()
        return first is second, third is fourth, body

    assert run(main) == (True, False, b"ok")


def test_bytes_after_the_response_make_its_connection_unusable() -> None:
    async def main() -> tuple[bool, bytes]:
        server, origin = await serve(lambda r, w: answer_each(r, w, OK + OK))
        pool = H1Pool(10, 5.0)
        conn, body = await get(pool, origin)
        pool.release(conn)
        again, _ = await get(pool, origin)
        pool.close()
        server.close()
        return conn is again, body

    assert run(main) == (False, b"ok")


@pytest.mark.parametrize("extra, fails", [(0, False), (1, True)])
def test_the_response_head_is_bounded(extra: int, fails: bool) -> None:
    """A head of exactly ``MAX_HEAD_BYTES`` (status line to the blank line) is read, one byte
    more is a protocol error, even when it arrives in many pieces."""
    start = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-pad: "
    pad = MAX_HEAD_BYTES + extra - len(start) - len(b"\r\n\r\n")
    response = start + b"a" * pad + b"\r\n\r\nok"

    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for at in range(0, len(response), 4093):  # pieces that do not align with the bound
            writer.write(response[at : at + 4093])
            await writer.drain()
        await reader.read()

    async def main() -> object:
        server, origin = await serve(dribble)
        pool = H1Pool(10, 5.0)
        try:
            _, body = await get(pool, origin)
            return body
        except EngineProtocolError:
            return "refused"
        finally:
            pool.close()
            server.close()

    assert run(main) == ("refused" if fails else b"ok")


def test_an_unread_body_pauses_reading_at_its_bound() -> None:
    total = 4 * HIGH_WATER

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        writer.write(b"x" * total)
        await writer.drain()
        await reader.read()

    async def main() -> tuple[bool, bool, int]:
        server, origin = await serve(big)
        pool = H1Pool(10, 5.0)
        conn = await pool.acquire(origin)
        conn.send(request_bytes("GET", origin, "/", {}, None))
        await conn.head()
        for _ in range(200):  # until the bound is passed and reading stops (bounded)
            if conn.transport is not None and not conn.transport.is_reading():
                break
            await asyncio.sleep(0.01)
        assert conn.transport is not None
        paused = not conn.transport.is_reading()
        read = len(await conn.readany())
        resumed = conn.transport.is_reading()
        while data := await conn.readany():
            read += len(data)
        pool.release(conn)
        pool.close()
        server.close()
        return paused, resumed, read

    paused, resumed, read = run(main)  # type: ignore[misc]
    assert paused and resumed and read == total


def test_a_body_without_a_length_ends_with_its_connection_and_a_lost_chunked_one_fails() -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async def cut_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\npart\r\n")
        await writer.drain()
        writer.close()

    async def main() -> tuple[bytes, bool, object]:
        server, origin = await serve(until_close)
        server2, origin2 = await serve(cut_chunked)
        pool = H1Pool(10, 5.0)
        conn, body = await get(pool, origin)
        pool.release(conn)  # not reusable: closed
        try:
            await get(pool, origin2)
            lost: object = None
        except ConnectionLost as error:
            lost = error
        pool.close()
        server.close()
        server2.close()
        return body, conn.reusable(), lost

    body, reusable, lost = run(main)  # type: ignore[misc]
    assert body == b"all of it" and not reusable and isinstance(lost, ConnectionLost)


def test_the_pool_holds_at_most_its_limit_and_a_waiter_gets_the_room() -> None:
    """With a limit of one, a call to a second origin waits for the first connection's
    release, then closes that idle connection to open its own."""

    async def main() -> tuple[bool, int, bytes]:
        server, origin = await serve(lambda r, w: answer_each(r, w, OK))
        server2, origin2 = await serve(lambda r, w: answer_each(r, w, OK))
        pool = H1Pool(1, 5.0)
        held = await pool.acquire(origin)
        other = asyncio.ensure_future(get(pool, origin2))
        await asyncio.sleep(0.05)
        waited = not other.done()
        held.send(request_bytes("GET", origin, "/x", {}, None))
        await held.head()
        while await held.readany():
            pass
        pool.release(held)
        conn, body = await other
        most = pool.open
        pool.release(conn)
        pool.close()
        server.close()
        server2.close()
        return waited, most, body

    assert run(main) == (True, 1, b"ok")


def test_idle_connections_past_their_keepalive_are_closed_by_the_sweep() -> None:
    async def main() -> int:
        server, origin = await serve(lambda r, w: answer_each(r, w, OK))
        pool = H1Pool(10, 0.05)
        conn, _ = await get(pool, origin)
        pool.release(conn)
        for _ in range(200):
            if pool.open == 0:
                break
            await asyncio.sleep(0.01)
        pool.close()
        server.close()
        return pool.open

    assert run(main) == 0


def test_a_request_is_one_write_with_its_length_and_refuses_a_header_that_would_split_it() -> None:
    origin = Origin.of("http://engine:8000/base/")
    data = request_bytes("POST", origin, "/v1/completions", {"X-Request-Id": "r1"}, b"{}")
    assert data == (
        b"POST /base/v1/completions HTTP/1.1\r\nHost: engine:8000\r\nX-Request-Id: r1\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    with pytest.raises(ValueError):
        request_bytes("GET", origin, "/", {"X-Request-Id": "a\r\nX-Evil: 1"}, None)
    with pytest.raises(ValueError):
        request_bytes("GET", origin, "/", {"X-Evil: 1\r\nX-Request-Id": "a"}, None)
    for unsendable in (
        {"X-Request-Id": "a\nX-Evil: 1"},
        {"X-Request-Id": "a\0"},
        {"X Request-Id": "a"},
        {"X-Request-Id\t": "a"},
        {"X-Request-Id\0": "a"},
        {"X-R\u00e9quest": "a"},
        {"": "a"},
    ):
        with pytest.raises(ValueError):
            request_bytes("GET", origin, "/", unsendable, None)
    sendable = {"X-Request-Id": "a b\tc", "traceparent": "00-ab-cd-01"}  # spaces, tabs in values
    assert b"X-Request-Id: a b\tc\r\n" in request_bytes("GET", origin, "/", sendable, None)
    with pytest.raises(ValueError):
        Origin.of("ftp://engine")
