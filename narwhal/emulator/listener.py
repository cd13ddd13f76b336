"""Serving, stopping and restarting the HTTP port of a running uvicorn server (``refused``).

Rule kept here: while an emulated engine acts out ``refused``, connecting to its HTTP port is
refused and no connection there is answered (kept-alive ones are closed after their reply, and
so is one the port accepted just as it stopped listening), while the KV side channel (a second
listening socket of the same server) keeps answering, ``/admin`` included, so the fault can be
cleared.

Theory of operation: the HTTP port is not one of uvicorn's asyncio servers but accepted here,
with the loop's public socket API, and each connection is handed to uvicorn's own protocol
(:meth:`asyncio.loop.connect_accepted_socket`, sharing the server's state, so uvicorn's
shutdown closes them too). An asyncio server would not do: it hands an accepted connection to
its protocol a loop iteration or two later, and a close in between either leaves the connection
open and unanswered (the server, closed, refuses to adopt it) or lets it through once its
protocol is made, unseen by the sweep of the server's connections, to be answered for the whole
fault. Here :meth:`ListenerControl.pause` stops accepting, closes the listening socket and
shuts down the port's connections, and a connection accepted before but made after is shut down
as soon as it is made. :meth:`ListenerControl.resume` binds the same port again
(:func:`narwhal.serving.bind`). :meth:`ListenerControl.start` (lifespan startup) begins serving
the socket bound by the runner; :meth:`ListenerControl.stop` (lifespan shutdown) ends it, and
connections arriving once uvicorn is shutting down are closed unanswered, as uvicorn's own
closed listeners would refuse them.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from narwhal.serving import bind


class ListenerControl:
    """Serve one port of a running uvicorn server, and stop and restart listening on it."""

    def __init__(self, server: uvicorn.Server, host: str, sock: socket.socket) -> None:
        self._server = server
        self._host = host
        self._port = int(sock.getsockname()[1])
        self._sock: socket.socket | None = sock
        self._handing_over: set[asyncio.Task[None]] = set()  # held: the loop keeps weak refs
        self.listening = True

    def start(self) -> None:
        """Begin accepting on the socket (in the server's running loop)."""
        if self._sock is not None:
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)

    def stop(self) -> None:
        """Stop accepting and close the listening socket (the connections are uvicorn's)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()

    async def aclose(self) -> None:
        """Stop accepting, then wait for the connections still being handed over."""
        self.stop()
        if self._handing_over:
            await asyncio.gather(*self._handing_over, return_exceptions=True)

    def _accept(self) -> None:
        """Accept every connection waiting and hand each to uvicorn's protocol."""
        sock = self._sock
        while sock is not None:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            if self._server.should_exit:
                conn.close()
                continue
            conn.setblocking(False)
            task = asyncio.get_running_loop().create_task(self._hand_over(conn))
            self._handing_over.add(task)
            task.add_done_callback(self._handing_over.discard)

    async def _hand_over(self, conn: socket.socket) -> None:
        server, config = self._server, self._server.config

        def protocol() -> asyncio.Protocol:
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=server.server_state, app_state=server.lifespan.state
            )
            return made

        loop = asyncio.get_running_loop()
        try:
            _, made = await loop.connect_accepted_socket(protocol, conn)
        except OSError:  # the client left before its protocol was made
            conn.close()
            return
        if not self.listening:  # accepted as the port stopped listening
            made.shutdown()  # type: ignore[attr-defined]

    def pause(self) -> None:
        """Stop listening, and close the port's kept-alive connections (after their reply)."""
        self.listening = False
        self.stop()
        for connection in list(self._server.server_state.connections):
            local = getattr(connection, "server", None)
            if local is not None and local[1] == self._port:
                connection.shutdown()

    async def resume(self) -> None:
        if self.listening:
            return
        self._sock = bind(self._host, self._port)
        self.listening = True
        self.start()
