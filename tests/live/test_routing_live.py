"""Load- and size-aware routing through a live router in front of emulated engines on
loopback: least_loaded follows the load the engines report on /metrics, and per-request
disaggregation prefills short prompts (or every prompt, when no producer is placeable and
no_producer = "local") on the consumer."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from narwhal.emulator.text import completion_tokens, prompt_text
from narwhal.emulator.timing import LinearTiming
from tests.live.conftest import Emulator, RouterHandle, metric_value

SCRAPED = {"scrape_interval_s": 0.05, "max_report_age_s": 1.0}


def ask(handle: RouterHandle, prompt: str, max_tokens: int = 3) -> str:
    reply = handle.client().completions.create(
        model="tiny-llama", prompt=prompt, max_tokens=max_tokens
    )
    return reply.choices[0].text


def expected(prompt: str, n: int = 3) -> str:
    return "".join(completion_tokens(prompt_text({"prompt": prompt}, chat=False), n))


@contextlib.contextmanager
def busy(engine: Emulator, streams: int) -> Iterator[None]:
    """``streams`` long streams open straight to ``engine`` (not through the router), closed
    (so the engine aborts them) on exit."""
    body = {"prompt": "busy", "max_tokens": 1000, "stream": True}
    with httpx.Client(timeout=10) as client, contextlib.ExitStack() as held:
        for _ in range(streams):
            held.enter_context(client.stream("POST", engine.url + "/v1/completions", json=body))
        yield


def decodes_placed(handle: RouterHandle, engine: Emulator) -> float:
    return metric_value(
        handle.metrics(), "narwhal_placements_total", engine=engine.url, phase="decode"
    )


@pytest.mark.parametrize("policy", ["least_loaded", "least_reserved"])
def test_least_loaded_sends_decodes_to_the_engine_reporting_less_load(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], policy: str
) -> None:
    producer = emulator("prefill")
    loaded = emulator("decode", timing=LinearTiming(decode_s_per_token=0.05))
    idle = emulator("decode")
    engines = [
        {"url": producer.url, "role": "prefill"},
        {"url": loaded.url, "role": "decode"},
        {"url": idle.url, "role": "decode"},
    ]
    handle = router(engines, routing={"decode": policy, "least_loaded": SCRAPED})
    with busy(loaded, 3):
        if policy == "least_loaded":
            handle.wait_for(
                lambda: (handle.engine(loaded.url)["load"] or {}).get("num_requests_running") == 3
            )
            assert handle.engine(idle.url)["load"]["num_requests_running"] == 0
            gauge = metric_value(
                handle.metrics(),
                "narwhal_engine_reported_load",
                engine=loaded.url,
                gauge="num_requests_running",
            )
            assert gauge == 3
            assert handle.engine(producer.url)["load"] is None  # prefill is not least_loaded
        for index in range(6):
            reported = (handle.engine(idle.url)["load"] or {}).get("reported_at")
            assert ask(handle, f"prompt {index}", max_tokens=2) == expected(f"prompt {index}", 2)
            if policy == "least_loaded":
                # the next placement sees a report made after this request ended: least_loaded
                # counts the placements since a report as waiting requests (the report cannot
                # show them yet), so requests faster than the scrapes would be spread out
                def fresh(since: float = reported) -> bool:
                    return bool(handle.engine(idle.url)["load"]["reported_at"] > since)

                handle.wait_for(fresh)
    if policy == "least_loaded":
        assert decodes_placed(handle, idle) == 6 and decodes_placed(handle, loaded) == 0
        assert metric_value(handle.metrics(), "narwhal_load_reports_total", engine=idle.url) > 0
    else:  # reservations do not see load the router did not send: the seeded ties split
        assert decodes_placed(handle, loaded) > 0 and decodes_placed(handle, idle) > 0
    assert handle.engine(loaded.url)["failure_streak"] == 0


def test_a_failing_scrape_is_logged_once_per_reason_and_counted(
    emulator: Callable[..., Emulator],
    router: Callable[..., RouterHandle],
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer, consumer, refusing = emulator("prefill"), emulator("decode"), emulator("decode")
    engines = [
        {"url": producer.url, "role": "prefill"},
        {"url": consumer.url, "role": "decode"},
        {"url": refusing.url, "role": "decode"},
    ]
    caplog.set_level(logging.INFO, logger="narwhal.live")
    handle = router(engines, routing={"decode": "least_loaded", "least_loaded": SCRAPED})
    refusing.faults({"kind": "refused"})

    def ignored() -> float:
        return metric_value(
            handle.metrics(), "narwhal_load_reports_ignored_total", engine=refusing.url
        )

    handle.wait_for(lambda: ignored() >= 5)
    assert handle.engine(refusing.url)["load_problem"] == "GET /metrics refused"
    lines = [r.getMessage() for r in caplog.records if refusing.url in r.getMessage()]
    # one line per change of reason, not per scrape (a kept-alive connection may first be
    # reset when the engine stops listening, then every new one is refused)
    refused = f"load report of {refusing.url} ignored: GET /metrics refused"
    reset = f"load report of {refusing.url} ignored: GET /metrics reset"
    assert lines in ([refused], [reset, refused])
    refusing.clear()
    handle.wait_for(lambda: handle.engine(refusing.url)["load_problem"] is None)
    after = [r.getMessage() for r in caplog.records if refusing.url in r.getMessage()]
    assert after == [*lines, f"load reports of {refusing.url} resumed"]


def test_prefix_affinity_matches_are_counted(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, first, second = emulator("prefill"), emulator("decode"), emulator("decode")
    engines = [
        {"url": producer.url, "role": "prefill"},
        {"url": first.url, "role": "decode"},
        {"url": second.url, "role": "decode"},
    ]
    handle = router(engines, routing={"decode": "prefix_affinity"})
    for _ in range(3):
        assert ask(handle, LONG) == expected(LONG)
    metrics = handle.metrics()
    assert (
        metric_value(metrics, "narwhal_prefix_affinity_total", phase="decode", result="miss") == 1
    )
    assert metric_value(metrics, "narwhal_prefix_affinity_total", phase="decode", result="hit") == 2


SHORT, LONG = "short prompt", "a long prompt " * 8  # 12 and 112 bytes


def test_a_short_prompt_is_prefilled_by_the_consumer_and_the_producer_gets_nothing(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle]
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        routing={"remote_prefill_min_tokens": 64},
    )
    assert ask(handle, SHORT) == expected(SHORT)
    assert producer.state()["requests"] == 0
    counts = consumer.state()
    assert counts["local_tokens"] > 0 and counts["external_kv_tokens"] == 0
    assert handle.status()["prefills"] == {
        "remote": 0,
        "short_prompt": 1,
        "no_producer": 0,
        "producer_failed": 0,
    }

    assert ask(handle, LONG) == expected(LONG)  # at or over the minimum: prefilled remotely
    assert producer.state()["prefills"] == 1
    assert consumer.state()["external_kv_tokens"] > 0
    metrics = handle.metrics()
    assert metric_value(metrics, "narwhal_prefills_total", route="short_prompt") == 1
    assert metric_value(metrics, "narwhal_prefills_total", route="remote") == 1


@pytest.mark.parametrize("no_producer", ["local", "fail"])
def test_with_no_placeable_producer_the_consumer_prefills_or_the_router_answers_503(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], no_producer: str
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [{"url": producer.url, "role": "prefill"}, {"url": consumer.url, "role": "decode"}],
        # no panic: the lone producer's ejection takes its role out
        recovery={"eject_after": 1, "probe_interval_s": 60.0, "panic_threshold_percent": 0},
        routing={"no_producer": no_producer},
    )
    producer.faults({"kind": "http_5xx", "code": 500})
    with pytest.raises(openai.APIStatusError) as caught:
        ask(handle, LONG)  # the producer fails once: ejected
    assert caught.value.status_code == 502
    assert handle.engine(producer.url)["state"] in ("ejected", "probing")
    if no_producer == "local":
        assert ask(handle, LONG) == expected(LONG)
        assert consumer.state()["local_tokens"] > 0
        assert handle.status()["prefills"]["no_producer"] == 1
    else:
        with pytest.raises(openai.APIStatusError) as caught:
            ask(handle, LONG)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"]
        assert consumer.state()["requests"] == 0


@pytest.mark.parametrize("fallback", ["local", "none"])
def test_when_every_producer_fails_the_consumer_prefills_and_the_client_gets_its_answer(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], fallback: str
) -> None:
    failing, refusing, consumer = emulator("prefill"), emulator("prefill"), emulator("decode")
    handle = router(
        [
            {"url": failing.url, "role": "prefill"},
            {"url": refusing.url, "role": "prefill"},
            {"url": consumer.url, "role": "decode"},
        ],
        recovery={"max_attempts": 2, "eject_after": 5, "probe_interval_s": 60.0},
        routing={"prefill_fallback": fallback},
    )
    failing.faults({"kind": "http_5xx", "code": 500})
    refusing.faults({"kind": "http_5xx", "code": 503})
    if fallback == "none":
        with pytest.raises(openai.APIStatusError) as caught:
            ask(handle, LONG, max_tokens=8)
        assert caught.value.status_code == 502
        assert consumer.state()["requests"] == 0
        assert handle.status()["prefills"]["producer_failed"] == 0
        return
    assert ask(handle, LONG, max_tokens=8) == expected(LONG, 8)  # the whole answer
    assert failing.state()["requests"] == 1 and refusing.state()["requests"] == 1
    counts = consumer.state()
    assert counts["local_tokens"] > 0 and counts["external_kv_tokens"] == 0  # no handoff
    for producer in (failing, refusing):  # each producer charged for its own failure
        assert handle.engine(producer.url)["failure_streak"] == 1
    assert handle.engine(consumer.url)["failure_streak"] == 0
    assert handle.status()["prefills"]["producer_failed"] == 1
    assert metric_value(handle.metrics(), "narwhal_prefills_total", route="producer_failed") == 1
    (request,) = handle.logged_requests()
    assert request["prefill_fallback"] is True and request["attempts"] == 3
    assert request["engines"][-1] == consumer.url and request["status"] == 200
    (line,) = [line for line in handle.logged() if line["event"] == "prefill_fallback"]
    assert line["engine"] == consumer.url and line["reason"] == "producer_failed"
    assert line["request"] == request["request_id"]
