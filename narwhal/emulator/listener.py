"""Stopping and restarting one listening port of a running uvicorn server (``refused``).

Rule kept here: while an emulated engine acts out ``refused``, connecting to its HTTP port is
refused and its kept-alive connections there are gone, while the KV side channel (a second
listening socket of the same server) keeps answering, ``/admin`` included, so the fault can be
cleared.

Theory of operation: closing an asyncio server closes only its listening socket, so
:meth:`ListenerControl.pause` closes the servers listening on the port and shuts down the
connections accepted on it (after their reply), so clients must reconnect and are refused.
:meth:`ListenerControl.resume` binds the same port again (:func:`narwhal.serving.bind`) and
serves it with uvicorn's own protocol factory, in the server's running loop.
"""

from __future__ import annotations

import asyncio

import uvicorn

from narwhal.serving import bind


class ListenerControl:
    """Stop and restart listening on one port of a running uvicorn server (in its loop)."""

    def __init__(self, server: uvicorn.Server, host: str, port: int) -> None:
        self._server = server
        self._host = host
        self._port = port
        self.listening = True

    def _mine(self) -> list[asyncio.base_events.Server]:
        found = []
        for srv in getattr(self._server, "servers", []):
            for sock in srv.sockets or ():
                if sock.getsockname()[1] == self._port:
                    found.append(srv)
        return found

    def pause(self) -> None:
        """Stop listening, and close the port's kept-alive connections (after their reply)."""
        for srv in self._mine():
            srv.close()
        for connection in list(self._server.server_state.connections):
            local = getattr(connection, "server", None)
            if local is not None and local[1] == self._port:
                connection.shutdown()
        self.listening = False

    async def resume(self) -> None:
        if self.listening:
            return
        server, config = self._server, self._server.config
        sock = bind(self._host, self._port)

        def protocol() -> asyncio.Protocol:
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=server.server_state, app_state=server.lifespan.state
            )
            return made

        loop = asyncio.get_running_loop()
        srv = await loop.create_server(protocol, sock=sock, backlog=config.backlog)
        server.servers.append(srv)
        self.listening = True
