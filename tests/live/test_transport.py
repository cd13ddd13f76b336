"""The engine transport over loopback: finished streams keep their connection, abandoned ones
do not; a runaway reply is read only up to its bound; a read's deadline ends it without
cancelling anything, and someone else's cancellation still propagates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio

from narwhal.core.legs import MAX_REPLY_BYTES
from narwhal.core.ports import Chunk, ConnectFailed, Reply, StreamOpened, TimedOut
from narwhal.live.clock import AnyioClock
from narwhal.live.transport import KEEPALIVE_EXPIRY_S, EngineTransport
from narwhal.serving import BackgroundServer, bind, make_server, port_of
from tests.live.conftest import HTTP, Emulator, RouterHandle, Servers

BODY = {"prompt": "hello", "max_tokens": 3, "stream": True}


def idle_connections(transport: EngineTransport) -> list[Any]:
    """The pooled connections no request holds."""
    return transport.pool.idle()


def busy_connections(transport: EngineTransport) -> int:
    return transport.pool.open - len(idle_connections(transport))


def pooled_connections(transport: EngineTransport) -> int:
    """Open connections of the pool, idle or busy."""
    return transport.pool.open


async def until(condition: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Wait (bounded) for ``condition``; the assertions after it judge the outcome."""
    with anyio.move_on_after(limit_s):
        while not condition():
            await anyio.sleep(0.01)


async def settled(transport: EngineTransport, limit_s: float = 5.0) -> None:
    """Wait (bounded) until no pooled connection is still busy with a pending close."""
    await until(lambda: busy_connections(transport) == 0 and not transport.draining, limit_s)


async def read_to_done(transport: EngineTransport, clock: AnyioClock, url: str) -> None:
    opened = await transport.open_stream(url, "/v1/completions", BODY, {}, clock.now() + 5)
    assert isinstance(opened, StreamOpened) and opened.status == 200
    seen = b""
    while b"[DONE]" not in seen:
        chunk = await transport.next_chunk(opened.handle, clock.now() + 5)
        assert isinstance(chunk, Chunk)
        seen += chunk.data
    transport.close_stream(opened.handle)


def test_finished_streams_reuse_one_connection(emulator: Callable[..., Emulator]) -> None:
    engine = emulator(role="both")

    async def main() -> int:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            for _ in range(4):
                await read_to_done(transport, clock, engine.url)
                await settled(transport)  # a close waits (bounded) for the body's end
            return pooled_connections(transport)

    assert anyio.run(main) == 1


def test_abandoned_stream_drops_its_connection(emulator: Callable[..., Emulator]) -> None:
    engine = emulator(role="both")
    engine.faults({"kind": "hang_first_token"})

    async def main() -> int:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            opened = await transport.open_stream(
                engine.url, "/v1/completions", BODY, {}, clock.now() + 5
            )
            assert isinstance(opened, StreamOpened)
            transport.close_stream(opened.handle)
            # The close waits (bounded) for the end of the hung body, then drops it.
            assert busy_connections(transport) == 1
            await until(lambda: opened.handle.conn.closed)
            await settled(transport)
            return pooled_connections(transport)

    assert anyio.run(main) == 0


def test_read_deadlines_time_out_and_outer_cancellation_propagates(
    emulator: Callable[..., Emulator],
) -> None:
    engine = emulator(role="both")
    engine.faults({"kind": "stall", "after_tokens": 1})

    async def main() -> tuple[bool, bool, float, bool]:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            opened = await transport.open_stream(
                engine.url, "/v1/completions", BODY, {}, clock.now() + 5
            )
            assert isinstance(opened, StreamOpened) and opened.status == 200
            # a long deadline first (its timer is kept), then a shorter one must still win
            first = await transport.next_chunk(opened.handle, clock.now() + 30)
            began = clock.now()
            silent = await transport.next_chunk(opened.handle, clock.now() + 0.2)
            waited = clock.now() - began
            transport.close_stream(opened.handle)

            opened = await transport.open_stream(
                engine.url, "/v1/completions", BODY, {}, clock.now() + 5
            )
            assert isinstance(opened, StreamOpened)
            await transport.next_chunk(opened.handle, clock.now() + 5)
            propagated = False
            with anyio.move_on_after(0.2) as scope:  # someone else's cancellation
                try:
                    await transport.next_chunk(opened.handle, clock.now() + 30)
                except BaseException:
                    propagated = True
                    raise
            transport.close_stream(opened.handle)
            return (
                isinstance(first, Chunk),
                isinstance(silent, TimedOut),
                waited,
                propagated and scope.cancelled_caught,
            )

    got_chunk, timed_out, waited, propagated = anyio.run(main)
    assert got_chunk and timed_out and propagated
    assert 0.15 < waited < 2.0


def test_idle_connections_expire_before_the_engines_close_them(
    emulator: Callable[..., Emulator],
) -> None:
    """A connection idle past the expiry is not reused (a fresh one is opened), and the expiry
    is below the 5 s keep-alive timeout of uvicorn and vLLM, so a periodic health check never
    races the engine closing its idle connection."""
    assert KEEPALIVE_EXPIRY_S < 5.0
    engine = emulator(role="both")

    async def main() -> list[bool]:
        clock = AnyioClock()
        async with EngineTransport(clock, keepalive_expiry_s=0.3) as transport:
            reused: list[bool] = []
            for pause in (0.05, 0.6):
                reply = await transport.call(
                    engine.url, "GET", "/health", None, {}, clock.now() + 5
                )
                assert isinstance(reply, Reply) and reply.status == 200
                before = idle_connections(transport)
                await anyio.sleep(pause)
                reply = await transport.call(
                    engine.url, "GET", "/health", None, {}, clock.now() + 5
                )
                assert isinstance(reply, Reply) and reply.status == 200
                reused.append(any(c in before for c in idle_connections(transport)))
            return reused

    assert anyio.run(main) == [True, False]  # kept within the expiry, replaced after it


RUNAWAY_MIB = 40  # what the runaway engine would send: well past MAX_REPLY_BYTES


async def runaway_engine(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An engine that answers every request with a 200 body that goes on and on."""
    assert scope["type"] == "http"
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    piece = b" " * (1024 * 1024)
    for _ in range(RUNAWAY_MIB):
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def serve_runaway(servers: Servers) -> str:
    sock = bind("127.0.0.1", 0)
    servers.start(BackgroundServer(make_server(runaway_engine, lifespan="off"), [sock]))
    return f"http://127.0.0.1:{port_of(sock)}"


def test_a_runaway_reply_is_read_only_up_to_its_bound(servers: Servers) -> None:
    url = serve_runaway(servers)

    async def main() -> object:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            return await transport.call(url, "POST", "/v1/completions", {}, {}, clock.now() + 30)

    reply = anyio.run(main)
    assert isinstance(reply, Reply) and reply.status == 200
    assert len(reply.body) == MAX_REPLY_BYTES + 1  # not the 40 MiB sent


def test_a_runaway_prefill_reply_is_a_502(
    servers: Servers,
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
) -> None:
    producer, consumer = serve_runaway(servers), emulator("decode")
    handle = router([{"url": producer, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
                    engine={"max_handoff_age_s": 10.0, "request_timeout_s": 20.0})  # fmt: skip
    reply = HTTP.post(handle.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert reply.status_code == 502
    assert reply.json()["error"]["message"] == f"prefill response over {MAX_REPLY_BYTES} bytes"
    assert handle.status()["requests_in_flight"] == 0


async def unfinished_error_engine(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers 500 and starts an error body that it never finishes."""
    assert scope["type"] == "http"
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 500, "headers": []})
    await send({"type": "http.response.body", "body": b'{"error": ', "more_body": True})
    await anyio.sleep(30)


def test_a_cancelled_open_closes_the_stream_it_was_reading(servers: Servers) -> None:
    sock = bind("127.0.0.1", 0)
    servers.start(BackgroundServer(make_server(unfinished_error_engine, lifespan="off"), [sock]))
    url = f"http://127.0.0.1:{port_of(sock)}"

    async def main() -> tuple[int, int]:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            with anyio.move_on_after(0.3):  # the client leaves while the error body is read
                await transport.open_stream(url, "/v1/completions", BODY, {}, clock.now() + 20)
            # Closing the unfinished error body waits (bounded) for its end, then drops it;
            # its connection leaves the pool when that close is done.
            await until(lambda: pooled_connections(transport) == 0)
            await settled(transport)
            return len(transport._open), pooled_connections(transport)

    assert anyio.run(main) == (0, 0)  # the stream and its connection were left open


def test_a_producer_without_kv_release_is_asked_once_and_releases_are_awaited(
    servers: Servers,
) -> None:
    """A producer answering 404 to ``/kv/release`` is never asked again; leaving the transport
    waits for a release still in flight (an owned task, not a loose one)."""
    asked: list[str] = []

    async def no_release_engine(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        asked.append(scope["path"])
        await anyio.sleep(0.2)  # still answering when the transport is left
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sock = bind("127.0.0.1", 0)
    servers.start(BackgroundServer(make_server(no_release_engine, lifespan="off"), [sock]))
    url = f"http://127.0.0.1:{port_of(sock)}"

    async def main() -> tuple[int, bool]:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            transport.release_handoff(url, {"remote_block_ids": [1]})
            await until(lambda: not transport._releases)
            transport.release_handoff(url, {"remote_block_ids": [2]})  # 404 remembered
            after_404 = len(asked)
        async with EngineTransport(clock) as second:  # a fresh one asks, and is left at once
            second.release_handoff(url, {"remote_block_ids": [3]})
        # Leaving waited for that release's answer: its 404 is recorded. (What the server
        # does after sending it races the client's return, so it is not what is checked.)
        return after_404, not second.releases.asks(url)

    assert anyio.run(main) == (1, True)  # asked once; the second transport's release awaited
    assert asked == ["/kv/release", "/kv/release"]


def test_a_malformed_engine_answer_is_a_reset_not_an_exception() -> None:
    """An answer llhttp cannot parse — a garbage status line, a broken chunk in the body of a
    stream — comes back as ``ConnectFailed("reset")``; the transport raises nothing."""

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b"/broken-chunk" in head:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n"
            )
            await writer.drain()
            await opened.wait()  # the stream is open: now break it
            writer.write(b"ZZZ\r\nnot a chunk\r\n")
        else:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    opened = asyncio.Event()

    async def main() -> tuple[object, object]:
        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        clock = AnyioClock()
        async with server, EngineTransport(clock) as transport:
            garbage = await transport.call(url, "GET", "/health", None, {}, clock.now() + 5)
            stream = await transport.open_stream(url, "/broken-chunk", BODY, {}, clock.now() + 5)
            assert isinstance(stream, StreamOpened) and stream.status == 200
            opened.set()
            broken = await transport.next_chunk(stream.handle, clock.now() + 5)
            while isinstance(broken, Chunk):  # the good bytes before the break, if apart
                broken = await transport.next_chunk(stream.handle, clock.now() + 5)
            transport.close_stream(stream.handle)
        return garbage, broken

    garbage, broken = anyio.run(main)
    assert isinstance(garbage, ConnectFailed) and garbage.reason == "reset"
    assert isinstance(broken, ConnectFailed) and broken.reason == "reset"


def serve_paced_events(servers: Servers, events: list[bytes], gap_s: float) -> str:
    """An engine that streams ``events`` (each its own write, ``gap_s`` apart), then says
    nothing more for 30 s."""

    async def paced(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await anyio.sleep(gap_s)
        await anyio.sleep(30)

    sock = bind("127.0.0.1", 0)
    servers.start(BackgroundServer(make_server(paced, lifespan="off"), [sock]))
    return f"http://127.0.0.1:{port_of(sock)}"


def test_reads_go_to_the_relay_first_and_what_it_declines_to_the_reader(
    servers: Servers,
) -> None:
    """Once a relay is set, each read that arrives while the reader waits is offered to it; a
    read it takes never reaches the reader, one it declines is the reader's next chunk."""
    events = [b"data: first\n\n", b"data: relay 1\n\n", b"data: relay 2\n\n", b"data: mine\n\n"]
    url = serve_paced_events(servers, events, 0.05)
    offered: list[bytes] = []

    def relay(data: bytes, at: float) -> float | None:
        offered.append(data)
        return at + 5 if data.startswith(b"data: relay") else None

    async def main() -> tuple[bytes, bytes]:
        clock = AnyioClock()
        async with EngineTransport(clock) as transport:
            opened = await transport.open_stream(url, "/v1/completions", BODY, {}, clock.now() + 5)
            assert isinstance(opened, StreamOpened) and opened.status == 200
            first = await transport.next_chunk(opened.handle, clock.now() + 5)
            assert transport.relay_reads(opened.handle, relay)
            after = await transport.next_chunk(opened.handle, clock.now() + 5)
            transport.close_stream(opened.handle)
            assert not transport.relay_reads(opened.handle, relay)  # closed: nothing to relay
            assert isinstance(first, Chunk) and isinstance(after, Chunk)
            return first.data, after.data

    assert anyio.run(main) == (b"data: first\n\n", b"data: mine\n\n")
    assert offered == [b"data: relay 1\n\n", b"data: relay 2\n\n", b"data: mine\n\n"]


def test_a_relayed_read_moves_the_read_deadline_to_the_one_it_returns(servers: Servers) -> None:
    """The reader's deadline is the one the relay returned for the last read it took: three
    reads 0.1 s apart, each pushing the deadline 0.3 s past it, time the read out about 0.5 s
    after it began, not at the 0.3 s it was called with."""
    url = serve_paced_events(servers, [b"data: %d\n\n" % i for i in range(4)], 0.1)

    async def main() -> tuple[object, float, int]:
        clock = AnyioClock()
        relayed = []

        def relay(data: bytes, at: float) -> float | None:
            relayed.append(data)
            return at + 0.3

        async with EngineTransport(clock) as transport:
            opened = await transport.open_stream(url, "/v1/completions", BODY, {}, clock.now() + 5)
            assert isinstance(opened, StreamOpened) and opened.status == 200
            assert isinstance(await transport.next_chunk(opened.handle, clock.now() + 5), Chunk)
            assert transport.relay_reads(opened.handle, relay)
            began = clock.now()
            result = await transport.next_chunk(opened.handle, began + 0.3)
            elapsed = clock.now() - began
            transport.close_stream(opened.handle)
            return result, elapsed, len(relayed)

    result, elapsed, relayed = anyio.run(main)
    assert isinstance(result, TimedOut) and relayed == 3
    assert 0.45 <= elapsed < 3.0
