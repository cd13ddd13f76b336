"""The engine client against h11's response parser (a strict, well-tested HTTP/1.1
implementation), over real sockets on 127.0.0.1: whatever h11 refuses as a response, the engine
client refuses too (a protocol error or a lost connection, never a body); where both read it,
they read the same status and the same body. Hostile heads from a table and seeded byte
mutations of well-formed responses."""

from __future__ import annotations

import asyncio
import random

import h11
import pytest

from narwhal.live.h1client import H1Pool
from narwhal.live.h1errors import ConnectionLost, EngineProtocolError
from tests.live.test_h1client import get, serve

Reading = tuple[int, bytes] | None  # (status, body), or None: refused


def h11_reads(raw: bytes) -> Reading:
    """What h11, as a client that sent one GET, reads from ``raw`` followed by the close."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/x", headers=[("host", "e")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    conn.receive_data(b"")
    status, body = 0, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.InformationalResponse):
                return None  # the engine client takes no 1xx: a refusal on both sides
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return status, body
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return None  # cut short
    except h11.RemoteProtocolError:
        return None


async def narwhal_reads(raw: bytes) -> Reading:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(raw)
            await writer.drain()
        finally:
            writer.close()

    server, origin = await serve(answer)
    pool = H1Pool(4, 5.0)
    try:
        conn, body = await get(pool, origin)
        return conn.status, body
    except (EngineProtocolError, ConnectionLost):
        return None
    finally:
        pool.close()
        server.close()


def read_both(raw: bytes) -> tuple[Reading, Reading]:
    async def main() -> Reading:
        return await asyncio.wait_for(narwhal_reads(raw), 5)

    return h11_reads(raw), asyncio.run(main())


def check(raw: bytes) -> None:
    strict, ours = read_both(raw)
    if strict is None:
        assert ours is None, f"h11 refuses {raw!r}, the engine client read {ours!r}"
    elif ours is not None:
        assert ours == strict, raw


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n3\r\n!!!\r\n0\r\n\r\n"
HOSTILE = [
    OK,
    CHUNKED,
    b"HTTP/1.1 200 OK\r\n\r\nuntil close",
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nshort",
    b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort",  # cut short by the close
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok!",
    b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2x\r\n\r\nok",
    CHUNKED.replace(b"\r\n\r\n", b"\r\ncontent-length: 2\r\n\r\n", 1),  # both framings
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff1\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok",  # no last chunk
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nz\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nbad header\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nx: a\r\n folded\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nx : a\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 2000 OK\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 20 OK\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/2.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok",
    b"garbage\r\n\r\n",
    b"",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\noops",
    b"HTTP/1.1 120 OK\r\ncontent-length: 2\r\n\r\nok",  # a 1xx is never a final response
    b"HTTP/1.1 100 Continue\r\n\r\n" + OK,
]


@pytest.mark.parametrize("raw", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_response_is_refused_wherever_h11_refuses_it(raw: bytes) -> None:
    check(raw)


def mutations(seed: int, count: int) -> list[bytes]:
    """Seeded byte edits (replace, insert, delete) of well-formed responses."""
    rng = random.Random(seed)
    alphabet = b"\r\n :;\t0123456789abcdefxHT/.-"
    out = []
    for _ in range(count):
        raw = bytearray(rng.choice((OK, CHUNKED)))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            kind = rng.randrange(3)
            if kind == 0:
                raw[at] = rng.choice(alphabet)
            elif kind == 1:
                raw.insert(at, rng.choice(alphabet))
            elif len(raw) > 1:
                del raw[at]
        out.append(bytes(raw))
    return out


def test_mutated_responses_are_read_alike_or_refused_where_h11_refuses() -> None:
    disagreements = []
    for raw in mutations(seed=11, count=300):
        strict, ours = read_both(raw)
        if (strict is None and ours is not None) or (
            strict is not None and ours is not None and strict != ours
        ):
            disagreements.append((raw, strict, ours))
    assert not disagreements, disagreements[:5]
