"""Run a ``narwhal`` subcommand with TCP_NODELAY on the connections its server accepts.

Why: ``narwhal.serving.bind`` makes its listening socket with ``socket.socket(family,
SOCK_STREAM)``, i.e. protocol 0, and asyncio only sets TCP_NODELAY on accepted sockets whose
protocol is IPPROTO_TCP (``asyncio.base_events._set_nodelay``). Without it, a streamed response
(headers, then a small chunk) waits for the client's delayed ACK: about 40 ms before the first
token. A real vLLM (uvicorn bound by host and port) does not have that delay, so the benchmark runs
its emulated engines through this shim; ``routers.py --narwhal-nodelay`` runs Narwhal through it
too, to show what the one-line fix in ``bind`` would buy.

Usage: ``python benchmarks/router/nodelay.py emulate --port ...`` (any ``narwhal`` arguments).
"""

from __future__ import annotations

import socket
import sys

import narwhal.serving as serving

_bind = serving.bind


def bind_tcp(host: str, port: int) -> socket.socket:
    sock = _bind(host, port)
    tcp = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
    tcp.setblocking(False)
    return tcp


serving.bind = bind_tcp

if __name__ == "__main__":
    from narwhal.cli import main

    sys.exit(main(sys.argv[1:]))
