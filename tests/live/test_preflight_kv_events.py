"""``narwhal preflight`` with ``kv_aware``: an engine it places on must publish KV events the
router reads and hashes as the router does; each failure says which of those it is."""

from __future__ import annotations

from typing import Any

import anyio

from narwhal.core.config import parse_config
from narwhal.live.preflight import Check, format_table, run_preflight
from tests.live.conftest import Emulator, Servers, start_emulator


def preflight(engines: list[dict[str, Any]], kv_aware: dict[str, Any] | None = None) -> list[Check]:
    data: dict[str, Any] = {
        "engine": {"first_token_timeout_s": 1.0},
        "engines": engines,
        "routing": {"prefill": "kv_aware", "kv_aware": kv_aware or {}},
    }
    return anyio.run(lambda: run_preflight(parse_config(data)))


def entries(producer: Emulator, consumer: Emulator, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel, **extra},
        {"url": consumer.url, "role": "decode"},
    ]


def kv_rows(rows: list[Check]) -> list[Check]:
    return [row for row in rows if row.check == "kv_events"]


def test_a_publishing_producer_passes_and_one_without_events_fails(servers: Servers) -> None:
    producer = start_emulator(servers, "prefill", kv_events_port=0)
    consumer = start_emulator(servers, "decode")
    assert producer.app.kv_events is not None
    rows = preflight(entries(producer, consumer, kv_events=producer.app.kv_events.endpoint))
    assert all(row.passed for row in rows), format_table(rows)
    (row,) = kv_rows(rows)  # the consumer is not placed by kv_aware: not checked
    assert row.target == producer.url and "block hashes match" in row.detail

    rows = preflight(entries(producer, consumer))
    (row,) = kv_rows(rows)
    assert not row.passed and "set its kv_events endpoint" in row.detail


def test_a_wrong_block_identity_or_a_silent_endpoint_fails_with_the_reason(
    servers: Servers,
) -> None:
    producer = start_emulator(servers, "prefill", kv_events_port=0)
    consumer = start_emulator(servers, "decode")
    assert producer.app.kv_events is not None
    endpoint = producer.app.kv_events.endpoint
    rows = preflight(entries(producer, consumer, kv_events=endpoint), {"hash_seed": "42"})
    (row,) = kv_rows(rows)
    assert not row.passed and "none with the router's hash" in row.detail, row.detail

    silent = start_emulator(servers, "prefill")  # publishes nothing; this port has no PUB
    rows = preflight(entries(silent, consumer, kv_events="tcp://127.0.0.1:9"))
    (row,) = kv_rows(rows)
    assert not row.passed and "no KV event publisher answers" in row.detail, row.detail
