"""RFC 9112 strictness of the router's edge, over raw loopback sockets with the whole router
behind it: a framing error after a complete head is a 400 at once and a close, with nothing
held (not the body timeout's 408); an unknown transfer coding is a 501; trailer fields never
become request headers (an API key in a trailer does not authenticate); Host is required, single
and valid on HTTP/1.1; and a head whose body never comes holds no admission slot. (Whatever h11
refuses, the edge refuses: tests/live/test_edge_h11.py.)"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import pytest

from narwhal.live.h1request import EdgeRequest, Response
from narwhal.live.h1server import EdgeServer
from tests.live.conftest import HTTP, Emulator, RouterHandle
from tests.live.test_edge_timeouts import connect, read_to_close, untouched
from tests.live.test_h1server import read_until, run, send

SLOW_BODY_S = 30.0  # client.body_timeout_s: an answer within GIVE_UP_S cannot be its 408
GIVE_UP_S = 5.0
BODY = b'{"prompt": "hi", "max_tokens": 2}'


@pytest.fixture
def start(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> Callable[..., RouterHandle]:
    def started(**options: object) -> RouterHandle:
        engines = [{"url": emulator("both").url, "role": "both"}]
        client = {"body_timeout_s": SLOW_BODY_S, "idle_timeout_s": SLOW_BODY_S}
        return router(engines, client=client, **options)

    return started


def chunked_head(extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n" + extra + b"\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def answer_of(handle: RouterHandle, data: bytes) -> tuple[int, dict[str, object], float]:
    """Send ``data``, keep the connection open, and read until the router closes it: the
    status, the error object (if any) and how long the close took."""
    with connect(handle) as sock:
        began = time.monotonic()
        sock.sendall(data)
        answer = read_to_close(sock)
        took = time.monotonic() - began
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), answer[:200]
    error = json.loads(body)["error"] if body.startswith(b"{") else {}
    return int(head.split(b" ")[1]), error, took


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"ffffffffffffffff1\r\n" + BODY, 400),  # chunk size overflow
        (b"%x\n%b\n0\n\n" % (len(BODY), BODY), 400),  # bare LF after a chunk size
        (chunk(BODY[:5]) + b"zz\r\n", 400),  # a chunk size that is not hex
    ],
    ids=["size-overflow", "bare-lf", "not-hex"],
)
def test_a_framing_error_after_a_complete_head_is_a_400_at_once_and_nothing_is_held(
    start: Callable[..., RouterHandle], body: bytes, status: int
) -> None:
    handle = start()
    code, error, took = answer_of(handle, chunked_head() + body)
    assert code == status and error["code"] == status
    assert "malformed HTTP request" in str(error["message"])
    assert took < GIVE_UP_S < SLOW_BODY_S  # not the body timeout's 408
    untouched(handle)


@pytest.mark.parametrize("coding", [b"xchunked", b"gzip, chunked", b"chunked;q=1"])
def test_a_transfer_coding_the_router_does_not_implement_is_a_501(
    start: Callable[..., RouterHandle], coding: bytes
) -> None:
    handle = start()
    head = chunked_head().replace(b"transfer-encoding: chunked", b"transfer-encoding: " + coding)
    code, error, took = answer_of(handle, head + chunk(BODY) + b"0\r\n\r\n")
    assert code == 501 and "not implemented" in str(error["message"])
    assert took < GIVE_UP_S
    untouched(handle)


def test_trailer_fields_never_become_request_headers(
    start: Callable[..., RouterHandle],
) -> None:
    handle = start(api_key="k")
    trailer = b"0\r\nauthorization: Bearer k\r\n\r\n"
    with connect(handle) as sock:
        sock.sendall(chunked_head() + chunk(BODY) + trailer)
        sock.settimeout(GIVE_UP_S)
        in_trailer = sock.recv(65536)
    assert in_trailer.startswith(b"HTTP/1.1 401 ")
    with connect(handle) as sock:  # the same key as a header field authenticates
        sock.sendall(chunked_head(b"authorization: Bearer k\r\n") + chunk(BODY) + b"0\r\n\r\n")
        sock.settimeout(GIVE_UP_S)
        in_head = sock.recv(65536)
    assert in_head.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "hosts",
    [b"", b"host: x\r\nhost: x\r\n", b"host: a b\r\n", b"host: x:80x\r\n", b"host: [::1\r\n"],
    ids=["missing", "twice", "space", "bad-port", "open-bracket"],
)
def test_an_http_1_1_request_needs_one_valid_host(
    start: Callable[..., RouterHandle], hosts: bytes
) -> None:
    handle = start()
    head = b"GET /v1/models HTTP/1.1\r\n" + hosts + b"\r\n"
    code, error, _ = answer_of(handle, head)
    assert code == 400 and "Host" in str(error["message"])


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: [::1]:8000\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nhost: router.example\r\n\r\n",
        b"GET /v1/models HTTP/1.0\r\n\r\n",  # HTTP/1.0 has no Host requirement
    ],
)
def test_a_request_with_a_valid_host_is_served(
    start: Callable[..., RouterHandle], request_head: bytes
) -> None:
    handle = start()
    with connect(handle) as sock:
        sock.sendall(request_head)
        sock.settimeout(GIVE_UP_S)
        assert sock.recv(65536).split(b" ")[1] == b"200"


def test_heads_whose_bodies_never_come_hold_no_admission_slot(
    start: Callable[..., RouterHandle],
) -> None:
    """Four times the slots in sockets that send a head and never its body: every real request
    is still served (before, each such socket held a slot until body_timeout_s)."""
    slots = 2
    handle = start(admission={"max_requests_in_flight": slots})
    stalled: list[socket.socket] = []
    try:
        for _ in range(4 * slots):
            sock = connect(handle)
            stalled.append(sock)
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"expect: 100-continue\r\ncontent-length: 100\r\n\r\n"
            )
            sock.settimeout(GIVE_UP_S)  # the handler is reading its body: it asks for it
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        for _ in range(3):
            answer = HTTP.post(
                handle.url + "/v1/completions",
                content=BODY,
                headers={"content-type": "application/json"},
            )
            assert answer.status_code == 200, answer.text
        status = handle.status()
        assert status["admission"]["in_flight"] == 0 and status["admission"]["refused"] == 0
    finally:
        for sock in stalled:
            sock.close()


def test_a_pipelined_request_whose_body_breaks_is_dropped_after_the_answer_before_it() -> None:
    """Both sent in one write: the second is parsed (and queued) while the first is handled.
    The first is answered; the broken one never reaches a handler; then the 400."""
    seen: list[str] = []

    async def handler(request: EdgeRequest) -> Response:
        seen.append(request.path)
        while await request.readany():
            pass
        return Response(200, request.path.encode())

    async def client(peer: socket.socket, edge: EdgeServer) -> bytes:
        first = b"POST /first HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nok"
        second = b"POST /second HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"
        await send(peer, first + second)
        return await read_until(peer, lambda got: False)

    answer = run(handler, client)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 400 " in answer and seen == ["/first"]
