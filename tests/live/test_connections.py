"""A live router counts its client connections, over raw loopback sockets: ``/status``'s
``connections`` and the ``narwhal_client_connections_*`` metrics show the connections open (the
asking one among them), the ``client.max_connections`` bound and the connections refused at it,
and the requests whose body is still arriving, each back where it was once the connections or
bodies end.

Every question here goes over one raw socket the test holds (so exactly one connection of the
count is the asker's), and every wait is a bounded poll of ``/status``."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.live.conftest import Emulator, RouterHandle, metric_value
from tests.live.test_edge_timeouts import read_to_close

GIVE_UP_S = 5.0  # a count that never comes: the test fails instead of hanging
BODY = b'{"prompt": "hi", "max_tokens": 2}'


@pytest.fixture
def start(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> Callable[..., RouterHandle]:
    def started(**client: object) -> RouterHandle:
        engines = [{"url": emulator("both").url, "role": "both"}]
        return router(engines, client={"idle_timeout_s": 30.0, **client})

    return started


def connect(handle: RouterHandle) -> socket.socket:
    host, port = handle.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=GIVE_UP_S)


def ask(sock: socket.socket, path: str) -> bytes:
    """GET ``path`` on the kept-alive ``sock``: the answer's body (it must be a 200)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    received = b""
    while b"\r\n\r\n" not in received:
        received += receive(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int(fields[b"content-length"])
    while len(body) < length:
        body += receive(sock)
    return body


def receive(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, "the router closed the connection"
    return chunk


def connections(asker: socket.socket) -> dict[str, Any]:
    counts: dict[str, Any] = json.loads(ask(asker, "/status"))["connections"]
    return counts


def wait_for(asker: socket.socket, **expected: int) -> dict[str, Any]:
    """``/status``'s ``connections`` once it shows ``expected`` (fails after GIVE_UP_S)."""
    end = time.monotonic() + GIVE_UP_S
    while True:
        counts = connections(asker)
        if all(counts[key] == value for key, value in expected.items()):
            return counts
        if time.monotonic() > end:
            raise AssertionError(f"not {expected} within {GIVE_UP_S} s: {counts}")
        time.sleep(0.02)


def scraped(asker: socket.socket, name: str) -> float:
    return metric_value(ask(asker, "/metrics").decode(), name)


def test_connections_open_are_counted_with_the_askers_own_and_released_at_their_close(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start(max_connections=50)
    with connect(handle) as asker:
        # only the asker's own (a request without a body is never reading one)
        assert wait_for(asker, open=1) == {
            "open": 1,
            "max_connections": 50,
            "refused": 0,
            "reading_body": 0,
        }
        held = [connect(handle) for _ in range(4)]
        try:
            wait_for(asker, open=5)
            assert scraped(asker, "narwhal_client_connections_open") == 5.0
            assert scraped(asker, "narwhal_client_connections_limit") == 50.0
        finally:
            for sock in held:
                sock.close()
        wait_for(asker, open=1)
        assert scraped(asker, "narwhal_client_connections_open") == 1.0


def test_a_connection_over_the_bound_is_counted_refused(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start(max_connections=3)
    with connect(handle) as asker, connect(handle) as second, connect(handle) as third:
        assert wait_for(asker, open=3)["refused"] == 0
        assert scraped(asker, "narwhal_client_connections_refused_total") == 0.0
        for refused in (1, 2):
            with connect(handle) as extra:
                assert read_to_close(extra) == b""  # closed at accept
            # counted before its close, so already there; and its descriptor is given back
            assert wait_for(asker, open=3)["refused"] == refused
            assert scraped(asker, "narwhal_client_connections_refused_total") == float(refused)
        for sock in (second, third):  # the ones within the bound are still served
            assert json.loads(ask(sock, "/livez")) == {"status": "alive"}


def chunked_head() -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )


@pytest.mark.parametrize("end", ["finished", "closed", "broken"])
def test_a_body_still_arriving_is_counted_until_it_ends(
    start: Callable[..., RouterHandle], end: str
) -> None:
    handle = start(body_timeout_s=30.0)
    with connect(handle) as asker, connect(handle) as sender:
        wait_for(asker, open=2, reading_body=0)
        if end == "broken":  # one valid chunk, then bytes no chunked body has
            sender.sendall(chunked_head() + b"5\r\n" + BODY[:5] + b"\r\n")
        else:
            head = (
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n"
            )
            sender.sendall(head + BODY[:5])
        wait_for(asker, reading_body=1)
        assert scraped(asker, "narwhal_client_connections_reading_body") == 1.0
        if end == "finished":
            sender.sendall(BODY[5:])
            assert receive(sender).startswith(b"HTTP/1.1 200 ")
            counts = wait_for(asker, reading_body=0)
            assert counts["open"] == 2  # the sender's connection is kept alive
        elif end == "closed":
            sender.close()
            wait_for(asker, open=1, reading_body=0)
        else:
            sender.sendall(b"zz\r\n")
            assert read_to_close(sender).startswith(b"HTTP/1.1 400 ")
            wait_for(asker, open=1, reading_body=0)
        assert scraped(asker, "narwhal_client_connections_reading_body") == 0.0
