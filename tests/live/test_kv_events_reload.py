"""KV event streams follow the configuration and show in ``/status``, live over 127.0.0.1 with
the emulator's publishers: a producer added by a reload is subscribed to (its events reach the
index, and requests are routed on them) and a removed one unsubscribed, without a restart;
each engine's stream state (connected, last sequence, gaps, falls back to the estimate) is in
``/status``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w

from narwhal.config_file import load_config
from narwhal.live.app import Router
from narwhal.live.serving import make_router_server
from narwhal.serving import BackgroundServer, bind, port_of
from tests.live.conftest import Emulator, RouterHandle, Servers, metric_value, start_emulator
from tests.live.conftest import start_router as _start_router
from tests.live.test_kv_events_live import complete, held, hits, prefix

ENGINE = {
    "first_token_timeout_s": 2.0,
    "decode_read_timeout_s": 1.0,
    "request_timeout_s": 10.0,
    "max_handoff_age_s": 2.0,
}
ROUTING = {"prefill": "kv_aware", "kv_aware": {"speculative_ttl_s": 0.001, "load_weight": 0.0}}
BLOCK = 16


def producer_entry(producer: Emulator, replay: bool = True) -> dict[str, Any]:
    publisher = producer.app.kv_events
    assert publisher is not None
    entry = {"url": producer.url, "role": "prefill", "kv_events": publisher.endpoint}
    if replay:
        entry["kv_events_replay"] = publisher.replay_endpoint
    return entry


def write_config(path: Path, producers: list[Emulator], consumer: Emulator) -> None:
    """The router's TOML file, replaced atomically."""
    engines = [producer_entry(p) for p in producers] + [{"url": consumer.url, "role": "decode"}]
    data = {
        "engine": ENGINE,
        "recovery": {"probe_interval_s": 0.2},
        "routing": ROUTING,
        "engines": engines,
    }
    staged = path.with_suffix(".new")
    staged.write_text(tomli_w.dumps(data))
    staged.replace(path)


def start_from_file(servers: Servers, path: Path) -> RouterHandle:
    router = Router(load_config(path), tick_s=0.02, config_path=path, reload_poll_s=0.0)
    sock = bind("127.0.0.1", 0)
    built = make_router_server(router, client=router.config.client, graceful_s=0.2)
    server = servers.start(BackgroundServer(built, [sock]))
    return RouterHandle(router, server, f"http://127.0.0.1:{port_of(sock)}")


def stream(router: RouterHandle, engine: Emulator) -> dict[str, Any] | None:
    """``engine``'s KV event stream in ``/status`` (None: not followed; KeyError: not listed)."""
    listed = [e for e in router.status()["engines"] if e["url"] == engine.url]
    if not listed:
        raise KeyError(engine.url)
    found: dict[str, Any] | None = listed[0]["kv_events"]
    return found


def connected(router: RouterHandle, engine: Emulator) -> bool:
    state = stream(router, engine)
    return state is not None and state["connected"]


def reload(router: RouterHandle, applied: int) -> None:
    assert router.router.reloader is not None
    router.router.reloader.request_from_thread()
    router.wait_for(lambda: metric_value(
        router.metrics(), "narwhal_config_reloads_total", result="applied") == applied)  # fmt: skip


def test_a_producer_added_by_reload_is_subscribed_and_a_removed_one_unsubscribed(
    servers: Servers, tmp_path: Path
) -> None:
    first, added = (start_emulator(servers, "prefill", kv_events_port=0) for _ in range(2))
    consumer = start_emulator(servers, "decode")
    path = tmp_path / "narwhal.toml"
    write_config(path, [first], consumer)
    router = start_from_file(servers, path)
    router.wait_for(lambda: connected(router, first))
    assert stream(router, consumer) is None  # no stream configured: none followed

    write_config(path, [first, added], consumer)
    reload(router, 1)
    router.wait_for(lambda: connected(router, added))  # subscribed without a restart
    router.wait_for(lambda: router.engine(added.url)["state"] == "ready")  # its probe passed
    for n in range(3):  # the added engine's own events route a request sharing its prefix
        shared = prefix(300 + n)
        complete(added.url, shared + " warm-up")  # straight to the engine: no placement
        router.wait_for(lambda: held(router, added.url, shared) == 12)  # noqa: B023
        before = hits(added), hits(first)
        assert complete(router.url, shared + " the question")["choices"]
        assert (hits(added) - before[0], hits(first) - before[1]) == (12 * BLOCK, 0)

    write_config(path, [added], consumer)
    reload(router, 2)
    subscriber = router.router.kv_events
    assert subscriber is not None
    router.wait_for(lambda: first.url not in subscriber.streams)
    index = router.router.policies.placement.kv_index
    assert index.blocks(first.url) == 0
    shared = prefix(400)
    complete(first.url, shared + " no longer followed")  # published by the removed engine
    complete(added.url, shared + " still followed")
    router.wait_for(lambda: held(router, added.url, shared) == 12)
    assert index.blocks(first.url) == 0  # the removed engine's batch never reached the index
    assert "narwhal_kv_events_stream_up{" + f'engine="{first.url}"' not in router.metrics()


def test_status_shows_each_stream_its_sequence_gaps_and_falls_back_to_the_estimate(
    servers: Servers,
) -> None:
    producer = start_emulator(servers, "prefill", kv_events_port=0)
    consumer = start_emulator(servers, "decode")
    engines = [producer_entry(producer, replay=False), {"url": consumer.url, "role": "decode"}]
    router = _start_router(servers, engines, routing=ROUTING)
    router.wait_for(lambda: connected(router, producer))
    state = stream(router, producer)
    assert state is not None
    assert state["last_seq"] is None and state["gaps"] == 0 and state["downs"] == 0

    complete(producer.url, prefix(500) + " starts the sequence")
    router.wait_for(lambda: held(router, producer.url, prefix(500)) == 12)
    state = stream(router, producer)
    assert state is not None
    first_seq = state["last_seq"]
    assert isinstance(first_seq, int) and state["batches"] >= 1

    publisher = producer.app.kv_events
    assert publisher is not None
    publisher.drop_next = 1  # lost, and no replay socket to recover it
    complete(producer.url, prefix(501) + " lost")
    complete(producer.url, prefix(502) + " shows the gap")
    router.wait_for(lambda: held(router, producer.url, prefix(502)) == 12)
    state = stream(router, producer)
    assert state is not None
    assert state["gaps"] == 1 and state["last_seq"] > first_seq + 1
    assert state["placed_on_estimate"] == 0  # nothing placed yet

    publisher.close()  # the stream goes down; the engine still serves
    router.wait_for(lambda: not connected(router, producer))
    for n in range(3):  # each placed on the estimate alone, never charged
        assert complete(router.url, prefix(600 + n) + " after the stream died")["choices"]
    state = stream(router, producer)
    assert state is not None
    assert state["downs"] == 1 and state["last_seq"] is None
    assert state["placed_on_estimate"] == 3
    assert router.engine(producer.url)["state"] == "ready"
    assert (
        metric_value(
            router.metrics(), "narwhal_kv_events_placed_on_estimate_total", engine=producer.url
        )
        == 3
    )
