"""Running servers on pre-bound sockets, in the foreground or a thread.

Rule kept here: sockets are bound before the server starts (port 0 gives an ephemeral port that
is known at once, with no race), and a server started here is always stopped by whoever started
it (:class:`BackgroundServer` is a context manager). The live router (``narwhal serve``, own server:
:mod:`narwhal.live.serving`) and the engine emulator (``narwhal emulate``, uvicorn) both run this
way, so the plumbing is neither's.

Theory of operation: :func:`bind` makes a listening TCP socket. :func:`make_server` configures a
uvicorn server for an app (HTTP/1.1 via h11 on asyncio's loop unless told otherwise).
:func:`serve_blocking` runs one on a list of sockets in the calling thread (the CLI; uvicorn
handles SIGINT and SIGTERM). :class:`BackgroundServer` runs a uvicorn server or any
:class:`Servable` (the router's) in a daemon thread with its own event loop (tests, tools) and
stops it with a bounded graceful shutdown.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol

import uvicorn

STARTUP_TIMEOUT_S = 15.0


class Servable(Protocol):
    """A server :class:`BackgroundServer` can run besides uvicorn's: it says when it serves,
    is told to stop by setting ``should_exit`` (from any thread), and names its event loop."""

    started: bool
    should_exit: bool

    def loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop]: ...

    async def serve(self, sockets: list[socket.socket]) -> None: ...


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: an ephemeral one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket's protocol says TCP, and without it the first token waits for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(256)
    sock.setblocking(False)
    return sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def make_server(
    app: Any,
    *,
    lifespan: Literal["auto", "on", "off"] = "on",
    log_level: str = "warning",
    graceful_s: float = 1.0,
    http: Literal["h11", "httptools"] | type[asyncio.Protocol] = "h11",
    loop: Literal["asyncio", "uvloop"] = "asyncio",
) -> uvicorn.Server:
    """A uvicorn server (HTTP/1.1 via h11 on asyncio's loop unless told otherwise); requests
    still running ``graceful_s`` after a shutdown began are cancelled."""
    config = uvicorn.Config(
        app,
        lifespan=lifespan,
        log_level=log_level,
        http=http,
        loop=loop,
        access_log=False,
        timeout_keep_alive=5,
    )
    config.timeout_graceful_shutdown = graceful_s  # type: ignore[assignment]
    return uvicorn.Server(config)


def serve_blocking(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
    """Run ``server`` on ``sockets`` in this thread until it is told to stop."""
    server.run(sockets=sockets)


class BackgroundServer:
    """A server in a daemon thread; ``with BackgroundServer(...) as s:`` stops it."""

    def __init__(self, server: uvicorn.Server | Servable, sockets: list[socket.socket]) -> None:
        self.server = server
        self.sockets = sockets
        self._thread = threading.Thread(target=self._run, daemon=True, name="narwhal-server")
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            server = self.server
            if isinstance(server, uvicorn.Server):
                factory = server.config.get_loop_factory()  # the loop the config names
            else:
                factory = server.loop_factory()
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(self.server.serve(sockets=self.sockets))
        except BaseException as error:
            self._error = error

    def start(self) -> BackgroundServer:
        self._thread.start()
        waited = 0.0
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server failed to start: {self._error!r}")
            if waited > STARTUP_TIMEOUT_S:
                raise RuntimeError("server did not start in time")
            threading.Event().wait(0.01)
            waited += 0.01
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        for sock in self.sockets:
            sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
