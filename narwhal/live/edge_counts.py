"""The router's client connections, counted, and the ``client.max_connections`` bound they keep.

Rule kept here: a socket accepted while ``limit`` connections are already open is refused (the
edge server closes it at once, before reading a byte) and counted in ``refused``; every
accepted socket, refused or not, is ``open`` from its accept until its connection is lost, so
``open`` is the number of descriptors the edge holds for clients (a refused one for the moment
its close takes). ``reading_body`` counts the requests whose head is complete and whose body is
not: each holds a connection (never an admission slot) until its body ends, breaks, its
connection is lost, or ``client.body_timeout_s`` cuts it. The counts are of one process: each
``narwhal serve --workers`` worker keeps its own, against its own ``limit``.

Theory of operation: the :class:`~narwhal.live.h1server.EdgeServer` holds one
:class:`ClientConnections` (the router's, :attr:`narwhal.live.app.Router.connections`, when it
serves a router) and sets its ``limit`` from the ``[client]`` settings it serves with; its
connections call :meth:`~ClientConnections.accept` when made and
:meth:`~ClientConnections.lose` when lost. ``live`` is the set of them (the one the server
walks at shutdown), so ``open`` and ``reading_body`` are read off it when asked rather than
kept beside it; only ``refused``, a count of sockets already gone, is kept. Everything runs on
the event loop's one thread; ``/status`` and ``/metrics`` (:mod:`narwhal.live.metrics`) read
them when asked.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger("narwhal.live")


class Counted(Protocol):
    """A client connection as counted here."""

    @property
    def reading_body(self) -> bool:
        """Whether a request's head has arrived and its body is still arriving."""
        ...


class ClientConnections:
    """Client connections open, refused at the bound, and reading a request body, in one
    router process."""

    __slots__ = ("limit", "live", "refused")

    def __init__(self, limit: int) -> None:
        self.limit = limit  # client.max_connections of the edge server that keeps these counts
        self.live: set[Counted] = set()  # accepted and not yet lost (what ``limit`` bounds)
        self.refused = 0  # sockets closed at accept because ``limit`` were open, since start

    @property
    def open(self) -> int:
        return len(self.live)

    @property
    def reading_body(self) -> int:
        return sum(1 for connection in self.live if connection.reading_body)

    def accept(self, connection: Counted) -> bool:
        """Count a connection just made; False when it is one over the bound (the caller
        closes it, and its loss is counted by :meth:`lose` as any other)."""
        self.live.add(connection)
        if len(self.live) > self.limit:
            self.refused += 1
            log.debug("Over client.max_connections: connection closed.")
            return False
        return True

    def lose(self, connection: Counted) -> None:
        """Count a connection lost."""
        self.live.discard(connection)

    def status(self) -> dict[str, int]:
        """``/status``'s ``connections`` (named as ``admission`` names its own bound's)."""
        return {
            "open": self.open,
            "max_connections": self.limit,
            "refused": self.refused,
            "reading_body": self.reading_body,
        }
