"""Ejection, quarantine, probe readmission, retries and cleanup, observed through /status and
/metrics of a live router in front of emulated engines."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest

from narwhal.emulator.text import completion_tokens, prompt_text
from tests.live.conftest import HTTP, Emulator, RouterHandle, metric_value

PROMPT = "probe me gently"


def ask(handle: RouterHandle, max_tokens: int = 3) -> str:
    reply = handle.client().completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=max_tokens
    )
    return reply.choices[0].text


def expected(n: int = 3) -> str:
    return "".join(completion_tokens(prompt_text({"prompt": PROMPT}, chat=False), n))


def test_a_lone_consumer_healthy_again_serves_in_panic_before_its_probe(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    """The role of one consumer panics (default threshold 50%) once it is ejected: while its
    probe waits (a minute away), the next request is served by it, not refused with 503."""
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        recovery={"eject_after": 2, "probe_interval_s": 60.0},
    )
    consumer.faults({"kind": "http_5xx", "code": 500})
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as caught:
            ask(handle)
        assert caught.value.status_code == 502
    assert handle.engine(consumer.url)["state"] in ("ejected", "probing")
    handle.wait_for(
        lambda: metric_value(handle.metrics(), "narwhal_probes_total", outcome="failed") >= 1
    )  # its first probe failed: the next is two minutes away
    consumer.clear()
    assert ask(handle) == expected()
    assert handle.engine(consumer.url)["state"] in ("ejected", "probing")  # still its probe's
    assert metric_value(handle.metrics(), "narwhal_panics_total", phase="decode") == 1
    panics = [line for line in handle.logged() if line.get("event") == "role_panic"]
    assert [(p["phase"], p["in_service"], p["engines"]) for p in panics] == [("decode", 0, 1)]


def test_ejection_then_probe_readmission(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        # no panic: the lone consumer's ejection takes its role out (tests/core/test_panic.py)
        recovery={"eject_after": 2, "probe_interval_s": 0.2, "panic_threshold_percent": 0},
    )
    consumer.faults({"kind": "http_5xx", "code": 500})
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as caught:
            ask(handle)
        assert caught.value.status_code == 502
    engine = handle.engine(consumer.url)
    assert engine["state"] in ("ejected", "probing")
    assert engine["ejected_since"] == pytest.approx(time.time(), abs=5)
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_ejections_total", engine=consumer.url) == 1

    # The only consumer is out: the router answers 503 with Retry-After, not a hang, and
    # places no prefill for a handoff nobody would pull. (Counted by the router's placements:
    # the producer's own prefill count also moves with the probes of the ejected consumer,
    # each of which prefills on it, every probe_interval_s.)
    def prefills_placed() -> float:
        metrics = handle.metrics()
        return metric_value(
            metrics, "narwhal_placements_total", engine=producer.url, phase="prefill"
        )

    placed_before = prefills_placed()
    with pytest.raises(openai.APIStatusError) as caught:
        ask(handle)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"]
    assert prefills_placed() == placed_before
    # Probes keep failing while the fault lasts; once cleared, one passes and readmits.
    handle.wait_for(
        lambda: metric_value(handle.metrics(), "narwhal_probes_total", outcome="failed") >= 1
    )
    consumer.clear()
    handle.wait_for(lambda: handle.engine(consumer.url)["state"] == "ready")
    metrics = handle.metrics()
    assert (
        metric_value(metrics, "narwhal_readmissions_total", engine=consumer.url, via="probe") == 1
    )
    assert metric_value(metrics, "narwhal_probes_total", engine=consumer.url, outcome="passed") == 1
    assert ask(handle) == expected()
    assert handle.engine(consumer.url)["failure_streak"] == 0
    # ...and an operator reading the JSON log saw each step, one line each
    health = [line for line in handle.logged() if line["event"].startswith("engine_")]
    kinds = [line["event"] for line in health]
    assert kinds[0] == "engine_ejected" and kinds[-1] == "engine_readmitted"
    assert kinds.count("engine_ejected") == 1 and kinds.count("engine_readmitted") == 1
    assert "engine_probe_failed" in kinds  # the first one (later ones within 10 s left out)
    ejected, readmitted = health[0], health[-1]
    assert ejected["engine"] == consumer.url and ejected["streak"] == 2
    assert ejected["reason"] == "breaker"
    assert ejected["time"] <= ejected["next_probe_at"] <= ejected["time"] + 1.0
    assert abs(ejected["time"] - time.time()) < 30
    assert readmitted["engine"] == consumer.url and readmitted["via"] == "probe"


def test_quarantine_is_visible(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, first, second = emulator("prefill"), emulator("decode"), emulator("decode")
    handle = router(
        [
            {"url": producer.url, "role": "prefill"},
            {"url": first.url, "role": "decode"},
            {"url": second.url, "role": "decode"},
        ],
        recovery={"failure_quarantine_s": 2.0, "eject_after": 5, "probe_interval_s": 60.0},
    )
    first.faults({"kind": "http_5xx", "code": 500})
    second.faults({"kind": "http_5xx", "code": 500})
    with pytest.raises(openai.APIStatusError):
        ask(handle)
    engines = {e["url"]: e for e in handle.status()["engines"]}
    quarantined = [e for e in engines.values() if e["state"] == "quarantined"]
    assert len(quarantined) == 1
    assert quarantined[0]["failure_streak"] == 1
    assert 1.0 < quarantined[0]["quarantined_until"] - time.time() <= 2.0
    assert metric_value(handle.metrics(), "narwhal_quarantines_total") == 1
    (logged,) = [line for line in handle.logged() if line["event"] == "engine_quarantined"]
    assert logged["engine"] == quarantined[0]["url"]
    assert logged["until"] == pytest.approx(quarantined[0]["quarantined_until"], abs=0.01)
    metrics = handle.metrics()
    assert (
        metric_value(
            metrics, "narwhal_engine_state", engine=quarantined[0]["url"], state="quarantined"
        )
        == 1
    )


def test_retry_before_commit_is_counted_and_logged(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        recovery={"max_attempts": 2, "probe_interval_s": 60.0},
    )
    consumer.faults({"kind": "hang_first_token", "count": 1})
    tokens = handle.client().completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=3, stream=True
    )
    assert "".join(c.choices[0].text for c in tokens if c.choices) == expected()
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_retries_total", fault="first_token_timeout") == 1
    assert metric_value(metrics, "narwhal_requests_total", outcome="ok", status="200") == 1
    assert metric_value(metrics, "narwhal_time_to_prefill_seconds_count") == 1
    assert metric_value(metrics, "narwhal_time_to_first_token_seconds_count") == 1
    lines = handle.logged_requests()
    assert len(lines) == 1
    line = lines[0]
    assert line["attempts"] == 2 and line["outcome"] == "ok" and line["status"] == 200
    assert line["engines"] == [producer.url, consumer.url, producer.url, consumer.url]
    assert 0 < line["ttft_s"] < line["first_byte_s"]
    assert line["arrival"] == pytest.approx(time.time(), abs=10)


@pytest.mark.parametrize("where", ["producer", "consumer"])
def test_client_disconnect_releases_everything(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], where: str
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        engine={"first_token_timeout_s": 10.0, "max_handoff_age_s": 10.0},
        recovery={"probe_interval_s": 60.0},
    )
    stuck = producer if where == "producer" else consumer
    stuck.faults({"kind": "hang_headers" if where == "producer" else "hang_first_token"})
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 3, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        HTTP.post(handle.url + "/v1/completions", json=body, timeout=0.5)
    handle.wait_for(lambda: handle.status()["requests_in_flight"] == 0)
    for engine in handle.status()["engines"]:
        assert engine["reservations"] == {"prefill": 0, "decode": 0}
        assert engine["failure_streak"] == 0  # a client cancel is never charged
    handle.wait_for(lambda: stuck.state()["running"] == 0)  # the upstream request was aborted
    assert stuck.state()["aborted"] == 1
    assert metric_value(handle.metrics(), "narwhal_requests_total", outcome="client_gone") == 1
