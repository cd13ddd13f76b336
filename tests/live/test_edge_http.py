"""HTTP/1 framing at the edge, over raw sockets: a client that half-closes after its request
still gets the whole answer, and an HTTP/1.0 client gets a stream without chunked encoding,
ended by the close."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import pytest

from tests.live.conftest import (
    Emulator,
    RouterHandle,
    Servers,
    metric_value,
    start_emulator,
    start_router,
)

GIVE_UP_S = 10.0


@pytest.fixture(scope="module")
def handle(module_servers: Servers) -> RouterHandle:
    engine = start_emulator(module_servers, "both")
    return start_router(module_servers, [{"url": engine.url, "role": "both"}])


def exchange(handle: RouterHandle, raw: bytes, *, half_close: bool = False) -> bytes:
    """Send ``raw`` on a fresh connection (then half-close it) and read until the router closes."""
    host, port = handle.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=GIVE_UP_S) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def post(body: dict[str, object], version: str = "1.1", close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /v1/completions HTTP/{version}\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n{'connection: close' + chr(13) + chr(10) if close else ''}"
        "\r\n"
    ).encode() + data


def split(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    """Status line, headers and body of the final response (after any interim ones)."""
    while answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        answer = answer.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_half_closes_after_its_request_gets_its_answer(
    handle: RouterHandle, stream: bool
) -> None:
    request = post({"prompt": "hi", "max_tokens": 4, "stream": stream})
    answer = exchange(handle, request, half_close=True)
    status, _, body = split(answer)
    assert status == "HTTP/1.1 200 OK"
    if stream:
        assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # chunked, complete
    else:
        assert json.loads(body)["choices"][0]["finish_reason"] == "length"
    handle.wait_for(lambda: handle.status()["requests_in_flight"] == 0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_closes_while_waiting_is_still_noticed_and_cancelled(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], stream: bool
) -> None:
    engine = emulator("both")
    handle = router([{"url": engine.url, "role": "both"}], engine={"first_token_timeout_s": 4.0})
    engine.faults({"kind": "hang_first_token"})  # no answer begins before the client leaves
    host, port = handle.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=GIVE_UP_S) as sock:
        sock.sendall(post({"prompt": "hi", "max_tokens": 4, "stream": stream}))
        handle.wait_for(lambda: engine.state()["running"] == 1)
    # a FIN like a half-close: the probes find the socket gone, well before the 4 s timeout
    handle.wait_for(lambda: handle.status()["requests_in_flight"] == 0, timeout=2.5)
    handle.wait_for(lambda: engine.state()["aborted"] == 1)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_requests_total", outcome="client_gone") == 1
    assert handle.engine(engine.url)["failure_streak"] == 0


def test_a_half_close_mid_body_is_still_a_disconnect(handle: RouterHandle) -> None:
    whole = post({"prompt": "hi", "max_tokens": 4})
    assert exchange(handle, whole[:-5], half_close=True) == b""
    handle.wait_for(lambda: handle.status()["admission"]["in_flight"] == 0)


def test_an_http_1_0_client_gets_an_unchunked_stream_ended_by_the_close(
    handle: RouterHandle,
) -> None:
    answer = exchange(handle, post({"prompt": "hi", "max_tokens": 4, "stream": True}, "1.0"))
    status, headers, body = split(answer)
    assert status == "HTTP/1.0 200 OK"  # answered in the request's version
    assert "transfer-encoding" not in headers and "content-length" not in headers
    # no keep-alive: the close ends the body (HTTP/1.0's default, so no connection header)
    assert headers["content-type"] == "text/event-stream"
    assert headers.get("connection", "close") == "close"
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(e.startswith(b"data: {") for e in events[:-2]) and len(events) >= 6


def test_an_http_1_0_client_gets_whole_answers_with_their_length(handle: RouterHandle) -> None:
    answer = exchange(handle, post({"prompt": "hi", "max_tokens": 4}, "1.0"))
    status, headers, body = split(answer)
    assert status == "HTTP/1.0 200 OK" and int(headers["content-length"]) == len(body)
    assert json.loads(body)["object"] == "text_completion"


def test_an_http_1_1_stream_is_still_chunked(handle: RouterHandle) -> None:
    answer = exchange(handle, post({"prompt": "hi", "max_tokens": 4, "stream": True}, close=True))
    _, headers, body = split(answer)
    assert headers["transfer-encoding"] == "chunked" and body.endswith(b"\r\n0\r\n\r\n")
