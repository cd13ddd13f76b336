"""Starting an emulated engine: bind its two sockets, build the app, hand back a server.

Rule kept here: the HTTP port and the KV side-channel port are bound before the app is built, so
the descriptor it advertises names a port that is really listening (port 0 picks free ports).

Theory of operation: :func:`build_emulator` returns the app, a uvicorn server wired to the app's
``refused`` fault (:class:`~narwhal.emulator.listener.ListenerControl` on the HTTP port) and the
sockets; the CLI serves them in the foreground, tests in a
:class:`~narwhal.serving.BackgroundServer`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

import uvicorn

from narwhal.emulator.app import EmulatorApp
from narwhal.emulator.faults import FaultSpec
from narwhal.emulator.listener import ListenerControl
from narwhal.emulator.state import EmulatorConfig
from narwhal.serving import bind, make_server, port_of


@dataclass
class BuiltEmulator:
    app: EmulatorApp
    server: uvicorn.Server
    sockets: list[socket.socket]  # uvicorn's to serve (the KV side channel)
    url: str
    side_channel: str


def build_emulator(
    config: EmulatorConfig,
    faults: list[FaultSpec] | None = None,
    *,
    side_channel: tuple[str, int] | None = None,
    graceful_s: float = 1.0,
    log_level: str = "warning",
) -> BuiltEmulator:
    """Bind ``config.host:config.port`` and the side channel (default: same host, free port)."""
    http_sock = bind(config.host, config.port)
    http_port = port_of(http_sock)
    kv_host, kv_port = side_channel or (config.host, 0)
    kv_sock = bind(kv_host, kv_port)
    config = replace(config, port=http_port, side_channel=(kv_host, port_of(kv_sock)))
    app = EmulatorApp(config, faults)
    server = make_server(app, lifespan="on", graceful_s=graceful_s, log_level=log_level)
    # the HTTP port is served by the listener control (from lifespan startup), uvicorn serves KV
    app.actor.listener = ListenerControl(server, config.host, http_sock)
    return BuiltEmulator(
        app=app,
        server=server,
        sockets=[kv_sock],
        url=f"http://{config.host}:{http_port}",
        side_channel=f"{kv_host}:{port_of(kv_sock)}",
    )
