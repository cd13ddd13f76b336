"""The router's HTTP server: Narwhal's HTTP/1.1 protocol with the edge's bounds, on uvloop.

Rule kept here: ``narwhal serve`` and the tests that stand in for it build the router's server
here, so both run the same parser, loop and bounds (:mod:`narwhal.live.h1server`, bound to
the ``[client]`` settings); binding sockets and running a server in a thread is
:mod:`narwhal.serving`, shared with the emulator.

Theory of operation: :meth:`RouterServer.serve` enters the router's resources and background
loops (:meth:`narwhal.live.app.Router.running`), serves the given sockets until told to stop
(:attr:`RouterServer.should_exit`, settable from any thread, or SIGINT/SIGTERM when serving in
the foreground), then stops listening, closes idle connections, gives requests in flight
``graceful_s`` to finish (what still runs is cancelled and ends its answer itself) and only
then leaves the router's resources: nothing outlives the call, and no request loses the engine
transport while it runs.

The process's descriptor limit is raised (soft up to hard) to room for ``client.max_connections``
plus the router's own connections to the engines: run out of descriptors and the router could
not dial an engine, which would then be charged for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import socket
from collections.abc import Callable

import uvloop

from narwhal.core.config import ClientSettings
from narwhal.live.app import Router
from narwhal.live.h1server import EdgeServer

# the engine connection pool's bound (narwhal.live.transport) plus files, sockets and headroom
OWN_DESCRIPTORS = 1000 + 256

log = logging.getLogger("narwhal.live")


def ensure_descriptors(needed: int) -> int:
    """Raise the soft descriptor limit toward ``needed`` (never past the hard limit, never
    lower); the limit in force, with a warning when it is short of ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "descriptor limit %d is below client.max_connections plus the router's own %d "
            "(raise the hard limit, ulimit -Hn, or lower client.max_connections)",
            soft,
            OWN_DESCRIPTORS,
        )
    return soft


class RouterServer:
    """The router served on pre-bound sockets (``with BackgroundServer(...)`` in
    tests and tools, :meth:`run` in the foreground for ``narwhal serve``)."""

    def __init__(self, router: Router, *, client: ClientSettings, graceful_s: float) -> None:
        self.router = router
        self.client = client
        self.graceful_s = graceful_s
        self.started = False
        self._exit = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Ask the server to stop (from any thread)."""
        self._exit = value
        loop, stop = self._loop, self._stop
        if value and loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop it serves on (None before :meth:`serve`)."""
        return self._loop

    def loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop]:
        return uvloop.new_event_loop

    async def serve(self, sockets: list[socket.socket], *, signals: bool = False) -> None:
        """Serve ``sockets`` until :attr:`should_exit` (or, with ``signals``, SIGINT/SIGTERM)."""
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if self._exit:
            self._stop.set()
        if signals:
            for number in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(number, self._stop.set)
        async with self.router.running():
            edge = EdgeServer(self.router.handle, self.client, self.router.connections)
            listening: list[asyncio.Server] = []
            try:
                for sock in sockets:
                    listening.append(await self._loop.create_server(edge, sock=sock))
                self.started = True
                await self._stop.wait()
            finally:
                for server in listening:
                    server.close()
                await edge.shutdown(self.graceful_s)
                if signals:
                    for number in (signal.SIGINT, signal.SIGTERM):
                        self._loop.remove_signal_handler(number)

    def run(self, sockets: list[socket.socket]) -> None:
        """Serve in this thread, on uvloop, until SIGINT or SIGTERM."""
        # What the process made before serving (modules, the configuration, the router) lives
        # as long as it does: frozen, the collector's full passes stop walking it.
        gc.freeze()
        with asyncio.Runner(loop_factory=self.loop_factory()) as runner:
            runner.run(self.serve(sockets, signals=True))


def make_router_server(
    router: Router, *, client: ClientSettings, graceful_s: float = 1.0
) -> RouterServer:
    """The router's server: llhttp with the edge's bounds, on uvloop (the emulator keeps
    uvicorn and h11, whose connection internals its ``reset`` fault uses)."""
    ensure_descriptors(client.max_connections + OWN_DESCRIPTORS)
    return RouterServer(router, client=client, graceful_s=graceful_s)
