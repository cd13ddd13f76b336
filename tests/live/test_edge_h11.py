"""The edge against h11, a strict and well-tested HTTP/1.1 implementation, as an oracle: a table
of hostile requests and requests mutated byte by byte (hypothesis, seeded) are sent over
loopback to an :class:`~narwhal.live.h1server.EdgeServer` whose handler echoes what it read.
Whatever h11 refuses, the edge never serves; whatever both accept, they read the same method,
path, headers and body. (h11 is laxer than the edge in places — it takes HTTP/2.0 request
lines, obs-fold and an HTTP/1.0 ``Transfer-Encoding`` — so the converse is not asserted.)"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote

import h11
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from narwhal.core.config import ClientSettings
from narwhal.live.h1request import EdgeRequest, Response
from narwhal.live.h1server import EdgeServer
from narwhal.serving import bind, port_of

GIVE_UP_S = 5.0


async def echo(request: EdgeRequest) -> Response:
    """What the edge read, as JSON (headers: the first value of each name)."""
    parts = []
    while piece := await request.readany():
        parts.append(piece)
    read = {
        "method": request.method,
        "path": request.path,
        "headers": dict(request.headers.items()),
        "body": b"".join(parts).decode("latin-1"),
    }
    return Response(200, json.dumps(read).encode(), {"content-type": "application/json"})


class EchoEdge:
    """An edge server in a thread of its own (its own uvloop), for blocking test sockets."""

    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(GIVE_UP_S)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            edge = EdgeServer(echo, ClientSettings(head_timeout_s=GIVE_UP_S))
            sock = bind("127.0.0.1", 0)
            self.port = port_of(sock)
            listening = await self._loop.create_server(edge, sock=sock)
            self._ready.set()
            await self._stop.wait()
            listening.close()
            await edge.shutdown(0.1)

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())

    def close(self) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(GIVE_UP_S)

    def exchange(self, data: bytes) -> bytes:
        """Send ``data`` then EOF (a complete request is still answered; an incomplete one is
        a disconnect), and read until the edge closes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=GIVE_UP_S) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            received = b""
            while True:
                try:
                    piece = sock.recv(65536)
                except ConnectionResetError:
                    return received
                if not piece:
                    return received
                received += piece


@pytest.fixture(scope="module")
def edge() -> Iterator[EchoEdge]:
    server = EchoEdge()
    yield server
    server.close()


@dataclass
class H11Reading:
    verdict: str  # "refused", "complete" or "incomplete"
    method: str = ""
    target: str = ""
    headers: dict[str, str] | None = None
    body: bytes = b""


def h11_reading(data: bytes) -> H11Reading:
    """How h11, as a server, reads the first request in ``data``."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    reading = H11Reading("incomplete")
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return H11Reading("incomplete")
            if isinstance(event, h11.Request):
                reading.method = event.method.decode("latin-1")
                reading.target = event.target.decode("latin-1")
                headers: dict[str, str] = {}
                for name, value in event.headers:
                    headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
                reading.headers = headers
            elif isinstance(event, h11.Data):
                reading.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                reading.verdict = "complete"
                return reading
    except h11.RemoteProtocolError:
        return H11Reading("refused")


def served(answer: bytes) -> dict[str, object] | None:
    """What the edge's handler read, if the first answer is its echo; None if refused."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    if head.split(b" ")[1:2] != [b"200"]:
        return None
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    read: dict[str, object] = json.loads(rest[:length])
    return read


def check(edge: EchoEdge, data: bytes) -> str:
    """The oracle's rule for one input; returns h11's verdict."""
    oracle = h11_reading(data)
    answer = edge.exchange(data)
    read = served(answer) if answer else None
    if oracle.verdict == "refused":
        assert read is None, f"h11 refuses {data!r}, the edge served {read}"
    elif oracle.verdict == "complete" and read is not None:
        assert read["method"] == oracle.method
        if oracle.target.startswith("/"):
            path = oracle.target.partition("?")[0].partition("#")[0]
            assert read["path"] == unquote(path)
        assert oracle.headers is not None
        edge_headers = read["headers"]
        assert isinstance(edge_headers, dict)
        for name, value in oracle.headers.items():
            assert edge_headers.get(name) == value, (name, data)
        assert read["body"] == oracle.body.decode("latin-1")
    return oracle.verdict


HOST = b"host: x\r\n"
SEEDS = [
    b"GET /v1/models?x=1 HTTP/1.1\r\n" + HOST + b"accept: */*\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\n" + HOST + b"content-length: 5\r\n\r\nhello",
    b"POST /a%20b HTTP/1.1\r\n" + HOST + b"transfer-encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\ntrailer-x: y\r\n\r\n",
    b"GET / HTTP/1.0\r\nx-a:  spaced  \r\n\r\n",
]
HOSTILE = [
    b"POST / HTTP/1.1\r\n" + HOST + b"transfer-encoding: chunked\r\n\r\nffffffffffffffff1\r\n",
    b"POST / HTTP/1.1\r\n" + HOST + b"transfer-encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HOST + b"transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HOST + b"transfer-encoding: chunked\r\ntransfer-encoding: chunked"
    b"\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HOST + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
    b"0\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HOST + b"content-length: 1\r\ncontent-length: 2\r\n\r\nab",
    b"POST / HTTP/1.1\r\n" + HOST + b"content-length: -1\r\n\r\n",
    b"POST / HTTP/1.1\r\n" + HOST + b"content-length: 1 2\r\n\r\nab",
    b"GET / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + HOST + b"x : y\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + HOST + b"x\ty: z\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + HOST + b": empty-name\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + HOST + b"x: a\x00b\r\n\r\n",
    b"GET /a\x7fb HTTP/1.1\r\n" + HOST + b"\r\n",
    b"GET /a b HTTP/1.1\r\n" + HOST + b"\r\n",
    b"G(T / HTTP/1.1\r\n" + HOST + b"\r\n",
    b"GET / HTTP/1.1 \r\n" + HOST + b"\r\n",
    b"GET / HTTQ/1.1\r\n" + HOST + b"\r\n",
    b" GET / HTTP/1.1\r\n" + HOST + b"\r\n",
]


@pytest.mark.parametrize("data", SEEDS + HOSTILE)
def test_the_edge_refuses_what_h11_refuses_and_reads_alike_what_both_accept(
    edge: EchoEdge, data: bytes
) -> None:
    check(edge, data)


def test_the_hostile_table_is_refused_by_the_edge(edge: EchoEdge) -> None:
    """Every hostile request is refused by the edge, whatever h11 says (h11 is laxer in some)."""
    for data in HOSTILE:
        answer = edge.exchange(data)
        assert not answer or served(answer) is None, data


NOISE = [b"\r", b"\n", b" ", b"\t", b":", b"\x00", b"0", b"f", b";", b",", b"a", b"\x7f", b"\x80"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "replace", "delete"]))
        noise = draw(st.sampled_from(NOISE))
        if kind == "insert":
            data[at:at] = noise
        elif at < len(data):
            data[at : at + 1] = noise if kind == "replace" else b""
    return bytes(data)


@settings(
    max_examples=500,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=mutated())
def test_mutated_requests_refused_by_h11_are_refused_by_the_edge(
    edge: EchoEdge, data: bytes
) -> None:
    check(edge, data)


def mostly(valid: list[bytes], invalid: list[bytes]) -> st.SearchStrategy[bytes]:
    """One of ``valid`` about four times in five, else one of ``invalid``."""
    choice = st.tuples(st.integers(0, 4), st.sampled_from(valid), st.sampled_from(invalid))
    return choice.map(lambda drawn: drawn[2] if drawn[0] == 4 else drawn[1])


@st.composite
def generated(draw: st.DrawFn) -> bytes:
    """A request assembled from parts, each usually valid and sometimes not."""
    method = draw(mostly([b"GET", b"POST", b"PUT"], [b"G T", b"", b"P\x00ST"]))
    target = draw(mostly([b"/", b"/v1/models?a=b", b"/%41", b"http://x/y"], [b"*", b"/a b"]))
    version = draw(mostly([b"HTTP/1.1", b"HTTP/1.0"], [b"HTTP/2.0", b"HTTP/1.10", b"http/1.1"]))
    field = st.tuples(
        mostly([b"content-length", b"transfer-encoding", b"x-a", b"Host"], [b"x a", b"x\x01"]),
        mostly([b": ", b":", b":\t"], [b" : "]),
        mostly([b"x", b"5", b"chunked", b" chunked "], [b"chunked, chunked", b"gzip", b"a\x7fb"]),
    )
    fields = draw(st.lists(field, max_size=3))
    if draw(st.integers(0, 4)) != 4:  # usually one Host first
        fields.insert(0, (b"host", b": ", b"x"))
    head = b"%s %s %s\r\n" % (method, target, version)
    head += b"".join(name + sep + value + b"\r\n" for name, sep, value in fields)
    body = draw(mostly([b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n"], [b"5\nhello\n0\n\n"]))
    return head + b"\r\n" + body


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=generated())
def test_generated_requests_refused_by_h11_are_refused_by_the_edge(
    edge: EchoEdge, data: bytes
) -> None:
    check(edge, data)
