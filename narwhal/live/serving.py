"""The router's uvicorn server: httptools' HTTP parser with a bound on request heads, on uvloop.

Rule kept here: ``narwhal serve`` and the tests that stand in for it build the router's server
here, so both run the same parser and loop; the plumbing shared with the emulator (binding,
serving in the foreground or a thread) is :mod:`narwhal.serving`.
"""

from __future__ import annotations

from typing import Any

import uvicorn

from narwhal.live.headlimit import BoundedHttpToolsProtocol
from narwhal.serving import make_server


def make_router_server(
    app: Any, *, log_level: str = "warning", graceful_s: float = 1.0
) -> uvicorn.Server:
    """The router's server: httptools' HTTP parser, with a bound on request heads, on uvloop
    (the emulator keeps h11, whose connection internals its ``reset`` fault uses, on asyncio's
    loop)."""
    return make_server(
        app,
        log_level=log_level,
        graceful_s=graceful_s,
        http=BoundedHttpToolsProtocol,
        loop="uvloop",
    )
