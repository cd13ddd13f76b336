"""What a request must be before the router reads it, over HTTP: an inference body sent as JSON
(a web page's "simple" cross-origin POST is a 415), to a Host in ``client.allowed_hosts`` when
that list is set (421), with liveness and readiness answered whatever the Host."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.core.config import ConfigError, parse_config
from narwhal.live.gate import host_name
from tests.live.conftest import HTTP, RouterHandle, Servers, start_emulator, start_router

BODY = b'{"prompt": "hi", "max_tokens": 2}'


@pytest.fixture(scope="module")
def engines(module_servers: Servers) -> list[dict[str, Any]]:
    return [{"url": start_emulator(module_servers, "both").url, "role": "both"}]


@pytest.fixture(scope="module")
def handle(module_servers: Servers, engines: list[dict[str, Any]]) -> RouterHandle:
    return start_router(module_servers, engines)


@pytest.fixture(scope="module")
def listed(module_servers: Servers, engines: list[dict[str, Any]]) -> RouterHandle:
    return start_router(
        module_servers, engines, client={"allowed_hosts": ["LocalHost", "127.0.0.1", "[::1]"]}
    )


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
    ids=["missing", "text", "form", "multipart"],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_not_sent_as_json_is_a_415(
    handle: RouterHandle, content_type: str | None, path: str
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    reply = HTTP.post(handle.url + path, content=BODY, headers=headers)
    assert reply.status_code == 415
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 415
    assert "application/json" in error["message"]
    assert handle.status()["admission"]["in_flight"] == 0


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=utf-8", "application/vnd.narwhal+json"],
)
def test_json_content_types_are_served(handle: RouterHandle, content_type: str) -> None:
    headers = {"content-type": content_type}
    reply = HTTP.post(handle.url + "/v1/completions", content=BODY, headers=headers)
    assert reply.status_code == 200 and reply.json()["object"] == "text_completion"


def test_any_host_is_answered_when_no_list_is_set(handle: RouterHandle) -> None:
    reply = HTTP.post(handle.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                      headers={"host": "evil.example:8000"})  # fmt: skip
    assert reply.status_code == 200


@pytest.mark.parametrize("host", ["localhost:8000", "LOCALHOST", "127.0.0.1", "[::1]:80"])
def test_listed_hosts_are_answered(listed: RouterHandle, host: str) -> None:
    reply = HTTP.post(listed.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                      headers={"host": host})  # fmt: skip
    assert reply.status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models", "/status", "/metrics"])
def test_a_host_not_listed_is_a_421_on_every_route(listed: RouterHandle, path: str) -> None:
    call = HTTP.post if path == "/v1/completions" else HTTP.get
    kwargs: dict[str, Any] = {"json": {"prompt": "hi"}} if call is HTTP.post else {}
    reply = call(listed.url + path, headers={"host": "rebound.example:8000"}, **kwargs)
    assert reply.status_code == 421
    assert "rebound.example:8000" in reply.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/livez", "/health"])
def test_probes_are_answered_whatever_the_host(listed: RouterHandle, path: str) -> None:
    assert HTTP.get(listed.url + path, headers={"host": "10.1.2.3:8000"}).status_code == 200


def test_host_names_are_compared_without_port_brackets_or_case() -> None:
    assert [host_name(h) for h in ["A.b:80", "[::1]:8000", "[::1]", "host.", "x"]] == [
        "a.b", "::1", "::1", "host", "x",
    ]  # fmt: skip


@pytest.mark.parametrize("bad", ["localhost:8000", "", "two words", "a/b"])
def test_an_allowed_host_that_is_not_a_name_is_refused(bad: str) -> None:
    data = {"client": {"allowed_hosts": [bad]}, "engines": [{"url": "http://e:1", "role": "both"}]}
    with pytest.raises(ConfigError, match=r"client\.allowed_hosts"):
        parse_config(data)
