"""``engines[].kv_events`` / ``kv_events_replay``: endpoints the router can dial, or refused."""

from __future__ import annotations

import pytest

from narwhal.core.config import ConfigError, parse_config


def engines(**extra: str) -> dict[str, object]:
    return {
        "engines": [
            {"url": "http://127.0.0.1:8100", "role": "prefill", **extra},
            {"url": "http://127.0.0.1:8200", "role": "decode"},
        ]
    }


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:5557", "tcp://engine-0.local:5557", "tcp://[::1]:5557",
                 "ipc:///run/vllm/kv.sock"],
)  # fmt: skip
def test_dialable_endpoints_are_kept(endpoint: str) -> None:
    entry = parse_config(engines(kv_events=endpoint, kv_events_replay=endpoint)).engines[0]
    assert entry.kv_events == endpoint and entry.kv_events_replay == endpoint


@pytest.mark.parametrize(
    "endpoint", ["tcp://*:5557", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://h:70000",
                 "http://127.0.0.1:5557", "ipc://", "127.0.0.1:5557"],
)  # fmt: skip
def test_endpoints_the_router_cannot_dial_are_refused_with_the_key(endpoint: str) -> None:
    with pytest.raises(ConfigError, match=r"engines\[0\]\.kv_events: must be a ZMQ endpoint"):
        parse_config(engines(kv_events=endpoint))
