"""The router's uvicorn server: httptools' HTTP parser with the edge's bounds, on uvloop.

Rule kept here: ``narwhal serve`` and the tests that stand in for it build the router's server
here, so both run the same parser, loop and bounds (:mod:`narwhal.live.edgeprotocol`, bound to
the ``[client]`` settings); the plumbing shared with the emulator (binding, serving in the
foreground or a thread) is :mod:`narwhal.serving`.

The process's descriptor limit is raised (soft up to hard) to room for ``client.max_connections``
plus the router's own connections to the engines: run out of descriptors and the router could
not dial an engine, which would then be charged for it.
"""

from __future__ import annotations

import logging
import resource
from typing import Any

import uvicorn

from narwhal.core.config import ClientSettings
from narwhal.live.edgeprotocol import edge_protocol
from narwhal.serving import make_server

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


def make_router_server(
    app: Any, *, client: ClientSettings, log_level: str = "warning", graceful_s: float = 1.0
) -> uvicorn.Server:
    """The router's server: httptools' HTTP parser with the edge's bounds, on uvloop (the
    emulator keeps h11, whose connection internals its ``reset`` fault uses, on asyncio's
    loop)."""
    ensure_descriptors(client.max_connections + OWN_DESCRIPTORS)
    return make_server(
        app,
        log_level=log_level,
        graceful_s=graceful_s,
        http=edge_protocol(client),
        loop="uvloop",
    )
