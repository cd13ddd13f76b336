"""Server CPU per request: aiohttp's low-level server, Narwhal's edge, a bare llhttp protocol.

Usage: ``.venv/bin/python benchmarks/server_request_cost.py``

Each server runs in a process of its own on uvloop and answers every request as the router
answers a one-token stream (a chunked SSE response: the head with the first event, then
``[DONE]`` with the body's end); one client in this process sends the same small JSON POST on
one kept-alive connection, one request at a time, and the figure is the server process's CPU
time per request, two alternating rounds. ``aiohttp`` is the stack of the router's
client-facing server (``narwhal/live/serving.py``: ``web.Server`` with a ``StreamResponse``);
``narwhal edge`` is the router's own server and sink as the router uses them
(``narwhal/live/h1server.py``'s ``EdgeServer``, ``narwhal/live/sink.py``'s ``ResponseSink``: the
body read, the commit, one event, ``[DONE]`` with the body's end), every bound of the edge
armed; ``llhttp protocol`` is an ``asyncio.Protocol`` fed to ``httptools``' parser that writes
its answer itself, with none of those bounds: what is left of a server when nothing but the
request and the answer is done (docs/benchmarks.md, "Where Narwhal's time goes").
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
from collections.abc import Callable
from multiprocessing.synchronize import Event

import uvloop

REQUESTS = 3000
BODY = b'{"model":"m","prompt":"' + b"x" * 300 + b'","max_tokens":1,"stream":true}'
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY)
) + BODY
EVENT = b'data: {"id":"a","choices":[{"text":"hi","index":0}]}\n\n'
DONE = b"data: [DONE]\n\n"


def serve_aiohttp(port: int, ready: Event) -> None:
    from aiohttp import web

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT)
        await response.write(DONE)
        await response.write_eof()
        return response

    async def main() -> None:
        runner = web.ServerRunner(web.Server(handler, access_log=None))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


def serve_narwhal_edge(port: int, ready: Event) -> None:
    from narwhal.core.config import ClientSettings
    from narwhal.live.h1request import EdgeRequest, Response
    from narwhal.live.h1server import EdgeServer
    from narwhal.live.sink import ResponseSink

    async def handler(request: EdgeRequest) -> Response | None:
        while await request.readany():
            pass
        sink = ResponseSink(request, {"x-request-id": "r"})
        await sink.commit({"content-type": "text/event-stream"})
        await sink.send(EVENT)
        await sink.end(DONE)
        sink.done()
        return None

    async def main() -> None:
        edge = EdgeServer(handler, ClientSettings())
        await asyncio.get_running_loop().create_server(edge, "127.0.0.1", port)
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


def serve_llhttp(port: int, ready: Event) -> None:
    import httptools

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    class Connection(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            asyncio.get_running_loop().create_task(self.answer())

        async def answer(self) -> None:
            self.request_body = b"".join(self.body)
            self.body = []
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunk(EVENT)
            )
            await asyncio.sleep(0)  # the next event comes later, as a decode's would
            self.transport.write(chunk(DONE) + b"0\r\n\r\n")

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", port)
        ready.set()
        await asyncio.Event().wait()

    uvloop.run(main())


def send_requests(port: int, count: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            sock.sendall(REQUEST)
            answer = b""
            while not answer.endswith(b"0\r\n\r\n"):
                answer += sock.recv(65536)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    servers: dict[str, Callable[[int, Event], None]] = {
        "aiohttp": serve_aiohttp,
        "narwhal edge": serve_narwhal_edge,
        "llhttp protocol": serve_llhttp,
    }
    for _ in range(2):  # alternated: the machine's speed drifts
        for name, serve in servers.items():
            port, ready = free_port(), multiprocessing.Event()
            server = multiprocessing.Process(target=serve, args=(port, ready), daemon=True)
            server.start()
            try:
                ready.wait(30)
                send_requests(port, 300)  # warm-up
                began = cpu_seconds(server.pid or 0)
                send_requests(port, REQUESTS)
                spent = cpu_seconds(server.pid or 0) - began
                print(f"{name:>16}: {1e6 * spent / REQUESTS:.0f} us server CPU per request")
            finally:
                server.terminate()
                server.join(5)


if __name__ == "__main__":
    main()
