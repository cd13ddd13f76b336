"""Acting faults out: the engine-wide ones (``refused``, ``freeze``, ``hang``) and the ways a
request hangs or is reset.

Rule kept here: an engine-wide fault lasts its ``seconds`` or until the faults are cleared
(``DELETE /admin/faults``), and clearing always brings the engine back: listening again, every
frozen request and stream running on. Per-request faults wait in the :class:`FaultBook`, which
the inference path draws from.

Theory of operation: ``freeze`` and ``hang`` are each an :class:`anyio.Event` that thawing sets.
Every request but ``/admin`` waits on the freeze before it is served
(:meth:`FaultActor.wait_thaw`, which gives up when the client leaves); an inference request
waits on both before each step, its prefill or KV pull and each token
(:meth:`FaultActor.wait_step`), so a hung engine still answers ``/health`` and opens streams but
generates nothing, as the simulated engine does.
``refused`` pauses the HTTP port's :class:`~narwhal.emulator.listener.ListenerControl`. Faults
given before the server runs (``--fault``) wait in :meth:`FaultActor.schedule` until the app's
lifespan starts (:meth:`FaultActor.start`), since listeners and timers need the running loop.
:meth:`FaultActor.reset` aborts the TCP connection with SO_LINGER 0, which needs uvicorn's h11
protocol (its ``send`` is a bound method of the connection cycle that holds the transport).
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Receive, Send

from narwhal.emulator.faults import ENGINE_KINDS, FaultBook, FaultSpec
from narwhal.emulator.listener import ListenerControl


class FaultActor:
    """The faults of one emulated engine, and the means to act them out."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.book = FaultBook(rng)  # ``rng``: what per-request probabilities are drawn from
        self.listener: ListenerControl | None = None  # the HTTP port's, set by the runner
        self._frozen: anyio.Event | None = None
        self._hung: anyio.Event | None = None
        self._pending: list[FaultSpec] = []
        self._timers: set[asyncio.Task[None]] = set()

    @property
    def frozen(self) -> bool:
        return self._frozen is not None

    @property
    def hung(self) -> bool:
        return self._hung is not None

    @property
    def listening(self) -> bool:
        return self.listener.listening if self.listener else True

    # ------------------------------------------------------------------ scripting faults

    def schedule(self, spec: FaultSpec) -> None:
        """Add a fault before the server runs (engine-wide ones wait for :meth:`start`)."""
        if spec.kind in ENGINE_KINDS:
            self._pending.append(spec)
        else:
            self.book.add(spec)

    async def start(self) -> None:
        """Serve the HTTP port, then start the engine-wide faults given before."""
        if self.listener is not None:
            self.listener.start()
        for spec in self._pending:
            await self.add(spec)
        self._pending.clear()

    async def add(self, spec: FaultSpec) -> None:
        if spec.kind not in ENGINE_KINDS:
            self.book.add(spec)
            return
        if spec.kind == "freeze":
            if self._frozen is None:
                self._frozen = anyio.Event()
        elif spec.kind == "hang":
            if self._hung is None:
                self._hung = anyio.Event()
        elif self.listener is not None:  # refused
            self.listener.pause()
        if spec.seconds is not None:
            self._later(spec.seconds, self.thaw)

    async def aclose(self) -> None:
        """Lifespan shutdown: stop serving the HTTP port, end the pending fault timers and wait
        for them and for the connections being handed over, so no task outlives the app."""
        if self.listener is not None:
            await self.listener.aclose()
        timers = list(self._timers)
        for task in timers:
            task.cancel()
        if timers:
            await asyncio.gather(*timers, return_exceptions=True)

    async def clear(self) -> None:
        """No fault left: the per-request ones forgotten, the engine-wide ones ended."""
        self.book.clear()
        await self.thaw()

    async def thaw(self) -> None:
        """End the engine-wide faults."""
        for event in (self._frozen, self._hung):
            if event is not None:
                event.set()
        self._frozen = self._hung = None
        if self.listener is not None:
            await self.listener.resume()

    def _later(self, seconds: float, job: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await asyncio.sleep(seconds)
            await job()

        task = asyncio.get_running_loop().create_task(run())
        self._timers.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._timers.discard)

    # ------------------------------------------------------------------ acting them out

    async def wait_thaw(self, receive: Receive) -> bool:
        """Wait while frozen; False when the client left meanwhile."""
        frozen = self._frozen
        if frozen is None:
            return True
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    scope.cancel()

                group.start_soon(watch)
                await frozen.wait()
                group.cancel_scope.cancel()
        return not scope.cancelled_caught

    async def wait_step(self) -> None:
        """No step runs while the engine is frozen (like SIGSTOP) or hung."""
        for event in (self._frozen, self._hung):
            if event is not None:
                await event.wait()

    @staticmethod
    async def hang(seconds: float | None) -> None:
        """Hang for ``seconds``, or until the client leaves (the watcher cancels us)."""
        if seconds is None:
            await anyio.sleep_forever()
        else:
            await anyio.sleep(seconds)

    @staticmethod
    async def reset(send: Send) -> None:
        """Drop the connection with a TCP reset (needs uvicorn's h11 server)."""
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if transport is None:
            raise RuntimeError("the reset fault needs the emulator to run under uvicorn (h11)")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
        await anyio.sleep_forever()  # the disconnect watcher ends us
