"""Tests for narwhal.core.descriptor's prefill-leg params and KV side-channel helpers
(the decode-leg descriptor's validation: test_descriptor.py)."""

from __future__ import annotations

import pytest

from narwhal.core.descriptor import parse_side_channel, prefill_kv_params, side_channel_of

NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"


def test_prefill_kv_params() -> None:
    assert prefill_kv_params(NIXL) == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert prefill_kv_params(NIXL) is not prefill_kv_params(NIXL)
    assert prefill_kv_params(NIXL, "ignored") == prefill_kv_params(NIXL)
    assert prefill_kv_params(MOONCAKE, "xfer-1") == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": "xfer-1",
    }
    for bad in (None, "", "  "):
        with pytest.raises(ValueError):
            prefill_kv_params(MOONCAKE, bad)


def test_side_channel_of() -> None:
    assert side_channel_of({"remote_host": "::1", "remote_port": 5600}, NIXL) == "[::1]:5600"
    assert side_channel_of({"remote_host": "h"}, NIXL) is None
    assert side_channel_of({"remote_host": "h", "remote_port": True}, NIXL) is None
    addr = {"remote_bootstrap_addr": "http://[fe80::1]:8998/"}
    assert side_channel_of(addr, MOONCAKE) == "[fe80::1]:8998"
    assert side_channel_of({"remote_bootstrap_addr": "nope"}, MOONCAKE) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:5559", ("127.0.0.1", 5559)),
        ("http://Host:1", ("Host", 1)),
        ("[::1]:65535", ("::1", 65535)),
        ("  localhost:5600 ", ("localhost", 5600)),
    ],
)
def test_parse_side_channel(text: str, expected: tuple[str, int]) -> None:
    assert parse_side_channel(text) == expected


@pytest.mark.parametrize(
    "text", ["", "host", ":1", "host:", "host:0", "host:65536", "host:+1", "a b:1", "[::1]1"]
)
def test_parse_side_channel_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_side_channel(text)
