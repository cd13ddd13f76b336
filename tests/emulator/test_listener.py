"""The ``refused`` fault's listener control (narwhal.emulator.listener) on a real uvicorn server:
once paused, the HTTP port answers nothing, not even on a connection the event loop accepted
just before the pause and had not yet handed to its protocol."""

from __future__ import annotations

import asyncio
import socket

import pytest

from narwhal.emulator.faults import FaultSpec
from narwhal.emulator.runner import build_emulator
from narwhal.emulator.state import EmulatorConfig, Role

METRICS = b"GET /metrics HTTP/1.1\r\nhost: engine\r\n\r\n"


async def answer(loop: asyncio.AbstractEventLoop, client: socket.socket) -> bytes | None:
    """What the engine sends back for one scrape on ``client``: b"" when it closed or reset the
    connection unanswered, None when nothing came within 2 s (the connection hangs)."""
    await loop.sock_sendall(client, METRICS)
    try:
        return await asyncio.wait_for(loop.sock_recv(client, 65536), timeout=2)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        return None


async def pause_just_after_accept() -> tuple[bytes | None, bytes | None]:
    """Pause the port in the loop iteration that accepts a connection, before its protocol is
    made; the scrape's answer on that connection, and on one kept alive from before."""
    built = build_emulator(EmulatorConfig(role=Role("decode")), graceful_s=0.2)
    control = built.app.actor.listener
    assert control is not None
    host, port = built.url.removeprefix("http://").split(":")
    serving = asyncio.create_task(built.server.serve(built.sockets))
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(5):
        while not built.server.started:
            await asyncio.sleep(0.01)
    kept = socket.create_connection((host, int(port)))
    kept.setblocking(False)
    assert (await answer(loop, kept) or b"").startswith(b"HTTP/1.1 200")
    # On loopback the handshake completes in the kernel, so the port is readable at once. The
    # next iteration runs the callback below, then the accept (whose protocol is made by a task
    # a step later), then the pause: after the accept, before the protocol knows of it.
    late = socket.create_connection((host, int(port)))
    late.setblocking(False)
    loop.call_soon(loop.call_soon, control.pause)
    try:
        async with asyncio.timeout(5):
            while control.listening:
                await asyncio.sleep(0)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5)
        return await answer(loop, late), await answer(loop, kept)
    finally:
        late.close()
        kept.close()
        built.server.should_exit = True
        await serving


def test_a_paused_port_answers_no_connection_not_even_one_accepted_as_it_paused() -> None:
    late, kept = asyncio.run(pause_just_after_accept())
    assert kept == b""  # kept alive from before: closed by the pause
    assert late == b""  # accepted as the pause began: closed too, not left hanging


def test_shutdown_leaves_no_fault_timer_running() -> None:
    """An engine-wide fault's timer (a ``freeze`` for 60 s) does not outlive the emulator: the
    lifespan's shutdown cancels it and waits for it, and the server ends at once."""

    async def main() -> tuple[int, set[asyncio.Task[object]]]:
        built = build_emulator(
            EmulatorConfig(role=Role("decode")),
            [FaultSpec("freeze", seconds=60.0)],
            graceful_s=0.2,
        )
        actor = built.app.actor
        serving = asyncio.create_task(built.server.serve(built.sockets))
        async with asyncio.timeout(5):
            while not built.server.started:
                await asyncio.sleep(0.01)
        timers = len(actor._timers)
        built.server.should_exit = True
        async with asyncio.timeout(5):
            await serving
        others = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        return timers, others

    timers, left = asyncio.run(main())
    assert timers == 1 and left == set()
