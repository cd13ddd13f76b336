"""The edge's time and count bounds, over raw sockets: an idle connection is closed, a head or
a body trickled past its limit gets 408 and a close (nothing reaches the core or an engine),
and a connection past ``client.max_connections`` is closed at accept."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Callable

import pytest

from narwhal.live.serving import ensure_descriptors
from tests.live.conftest import HTTP, Emulator, RouterHandle

BOUND_S = 0.3
TIMEOUTS = {"head_timeout_s": BOUND_S, "body_timeout_s": BOUND_S, "idle_timeout_s": BOUND_S}
GIVE_UP_S = 5.0  # a bound that did not hold: the test fails instead of hanging


@pytest.fixture
def start(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> Callable[..., RouterHandle]:
    def started(**client: object) -> RouterHandle:
        engines = [{"url": emulator("both").url, "role": "both"}]
        return router(engines, client={**TIMEOUTS, **client})

    return started


def connect(handle: RouterHandle) -> socket.socket:
    host, port = handle.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=GIVE_UP_S)


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the router sends until it closes the connection (fails after GIVE_UP_S)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def trickle(sock: socket.socket, piece: bytes, every_s: float = 0.05) -> bytes:
    """Send ``piece`` every ``every_s``, whatever the router answers, until it closes the
    connection; everything it sent."""
    sock.settimeout(every_s)
    received = b""
    end = time.monotonic() + GIVE_UP_S
    while time.monotonic() < end:
        try:
            sock.sendall(piece)
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"still open after {GIVE_UP_S} s of trickling: {received[:80]!r}")


def request(body: bytes = b'{"prompt": "hi", "max_tokens": 2}') -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def untouched(handle: RouterHandle) -> None:
    status = handle.status()
    assert status["requests_in_flight"] == 0 and status["admission"]["in_flight"] == 0
    assert [(e["state"], e["failure_streak"]) for e in status["engines"]] == [("ready", 0)]


def test_a_connection_that_never_sends_is_closed_after_the_idle_timeout(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start()
    with connect(handle) as sock:
        began = time.monotonic()
        assert read_to_close(sock) == b""
        assert time.monotonic() - began < GIVE_UP_S


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start()
    with connect(handle) as sock:
        sock.sendall(request())
        began = time.monotonic()
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in answer.lower()
    assert time.monotonic() - began < 10 * BOUND_S  # the configured bound, not uvicorn's 5 s


def test_a_head_trickled_past_its_limit_is_a_408_and_a_close(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start()
    with connect(handle) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        answer = trickle(sock, b"x-a: b\r\n")  # a header line every 50 ms, never the end
    assert answer.startswith(b"HTTP/1.1 408 ")
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert "client.head_timeout_s" in error["message"]
    untouched(handle)


def test_a_body_trickled_past_its_limit_is_a_408_error_and_nothing_is_charged(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start()
    with connect(handle) as sock:
        sock.sendall(request(b"{" + b" " * 998 + b"}").split(b"\r\n\r\n")[0] + b"\r\n\r\n")
        answer = trickle(sock, b" ")  # a byte every 50 ms of a 1000-byte body
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head
    error = json.loads(body)["error"]
    assert error["code"] == 408 and error["type"] == "invalid_request_error"
    assert "client.body_timeout_s" in error["message"]
    untouched(handle)


def test_a_body_the_router_did_not_need_is_bounded_too(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> None:
    # refused for its key before the body was read: the 401 is out, the trickle is cut
    handle = router([{"url": emulator("both").url, "role": "both"}], client=TIMEOUTS, api_key="k")
    with connect(handle) as sock:
        sock.sendall(request(b"{" + b" " * 998 + b"}").split(b"\r\n\r\n")[0] + b"\r\n\r\n")
        answer = trickle(sock, b" ")
    assert answer.startswith(b"HTTP/1.1 401 ") and answer.count(b"HTTP/1.1") == 1


def test_a_slow_but_steady_client_within_the_bounds_is_served(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start(head_timeout_s=2.0, body_timeout_s=2.0)
    with connect(handle) as sock:
        whole = request()
        for at in range(0, len(whole), 16):  # about 0.5 s in all, under both bounds
            sock.sendall(whole[at : at + 16])
            time.sleep(0.01)
        sock.settimeout(GIVE_UP_S)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_a_connection_past_max_connections_is_closed_at_once(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start(max_connections=3, idle_timeout_s=30.0)
    held = [connect(handle) for _ in range(3)]
    try:
        with connect(handle) as extra:
            assert read_to_close(extra) == b""  # closed at accept, long before idle_timeout_s
        held[0].sendall(request())  # the ones within the bound are served
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held:
            sock.close()
    handle.wait_for(lambda: HTTP.get(handle.url + "/livez").status_code == 200)


def test_the_descriptor_limit_is_raised_toward_what_the_bound_needs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        pytest.skip("no finite descriptor limit here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 2, hard))  # room below, as in a service
    try:
        assert ensure_descriptors(soft - 1) == soft - 1
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft - 1
        assert ensure_descriptors(soft - 2) == soft - 1  # never lowered
        assert not caplog.records
        assert ensure_descriptors(hard + 1) == hard  # never past the hard limit: said so
        assert "below client.max_connections" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
