"""The router refuses a request head over MAX_HEAD_BYTES with 431, however it arrives, and
nothing else: large bodies, heads just under the bound and kept-alive connections pass."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from narwhal.live.h1server import MAX_HEAD_BYTES
from tests.live.conftest import HTTP, RouterHandle, Servers, start_emulator, start_router


@pytest.fixture(scope="module")
def handle(module_servers: Servers) -> RouterHandle:
    """One router and pair for the module: its tests only send requests and read the answers."""
    producer = start_emulator(module_servers, "prefill")
    consumer = start_emulator(module_servers, "decode")
    return start_router(
        module_servers,
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
    )


def request(extra_header: int, body: bytes = b'{"prompt": "hi", "max_tokens": 2}') -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + b"x-pad: " + b"a" * extra_header + b"\r\n"
        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip


def exchange(url: str, pieces: list[bytes], replies: int = 1) -> list[bytes]:
    """Send ``pieces`` one write each on one connection; read until ``replies`` responses or EOF."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        received = b""
        try:
            for piece in pieces:
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-way: the answer is already waiting
        while received.count(b"HTTP/1.1 ") < replies or not received.endswith((b"}", b"\n")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return [b"HTTP/1.1 " + part for part in received.split(b"HTTP/1.1 ")[1:]]


def test_a_head_over_the_bound_is_a_431_and_the_connection_closes(handle: RouterHandle) -> None:
    # sent in one write, 1 MiB cannot arrive in the one read that crosses the bound
    (reply,) = exchange(handle.url, [request(1024 * 1024)])
    assert reply.startswith(b"HTTP/1.1 431 ")
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == 431 and "headers over 65536 bytes" in body["error"]["message"]
    assert handle.status()["requests_in_flight"] == 0


def test_a_head_trickled_past_the_bound_is_refused_before_it_ends(handle: RouterHandle) -> None:
    start = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-pad: "
    pieces = [start] + [b"a" * 4096] * (MAX_HEAD_BYTES // 4096 + 4)  # never finished
    (reply,) = exchange(handle.url, pieces)
    assert reply.startswith(b"HTTP/1.1 431 ")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"headers": {"x-pad": "a" * (MAX_HEAD_BYTES - 2048)}, "json": {"prompt": "hi"}},
        {"json": {"prompt": "hi", "max_tokens": 2, "user": "u" * (1024 * 1024)}},
    ],
    ids=["head_just_under", "one_mib_body"],
)
def test_heads_under_the_bound_and_large_bodies_pass(
    handle: RouterHandle, kwargs: dict[str, Any]
) -> None:
    assert HTTP.post(handle.url + "/v1/completions", **kwargs).status_code == 200


def test_the_count_starts_again_for_each_request_on_a_kept_alive_connection(
    handle: RouterHandle,
) -> None:
    three = request(MAX_HEAD_BYTES // 2) * 3  # 1.5 bounds on one connection, half each
    replies = exchange(handle.url, [three], replies=3)
    assert [r.split(b"\r\n", 1)[0] for r in replies] == [b"HTTP/1.1 200 OK"] * 3
