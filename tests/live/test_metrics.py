"""The router's request-level series: plain counts exported as prometheus_client exports its own.

``prometheus_client``'s own ``Histogram`` is the oracle for the exported histogram: the same
observations must give the same ``_bucket``, ``_count`` and ``_sum`` samples.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.records import Decision, RequestRecord
from narwhal.live.metrics import LATENCY_BUCKETS, RouterMetrics

NAME = "narwhal_time_to_first_token_seconds"


def _samples(text: str, name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of family ``name`` in an exposition: (sample name, labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for sample in family.samples:
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _record(
    first_byte_s: float | None,
    *,
    status: int = 200,
    outcome: str = "ok",
    output_tokens: int = 1,
    finished_s: float = 1.0,
    attempts: int = 2,
    prompt_tokens: int | None = 7,
) -> RequestRecord:
    return RequestRecord(
        request_id="r",
        arrival=0.0,
        status=status,
        outcome=outcome,
        committed=status == 200,
        ttft_s=0.001,
        first_byte_s=first_byte_s,
        finished_s=finished_s,
        attempts=attempts,
        engines=("http://p", "http://c"),
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
    )


# the bounds themselves, either side of them, zero, and values beyond the last bound
observations = st.lists(
    st.one_of(
        st.sampled_from(LATENCY_BUCKETS),
        st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
    ),
    min_size=1,
    max_size=40,
)


@given(observations)
def test_a_histogram_exports_what_prometheus_client_would(values: list[float]) -> None:
    oracle_registry = CollectorRegistry()
    oracle = Histogram(
        NAME, "oracle", ["model"], buckets=LATENCY_BUCKETS, registry=oracle_registry
    ).labels("m")
    metrics = RouterMetrics()
    for value in values:
        oracle.observe(value)
        metrics.on_record(_record(value), "m")
    expected = _samples(generate_latest(oracle_registry).decode(), NAME)
    exported = _samples(metrics.render().decode(), NAME)
    assert exported.keys() == expected.keys()
    for key, value in expected.items():
        assert exported[key] == value, key


def test_a_value_on_a_bound_is_in_that_bucket() -> None:
    metrics = RouterMetrics()
    metrics.on_record(_record(0.01), "m")
    exported = _samples(metrics.render().decode(), NAME)
    bucket = f"{NAME}_bucket"
    assert exported[bucket, (("le", "0.005"), ("model", "m"))] == 0.0
    assert exported[bucket, (("le", "0.01"), ("model", "m"))] == 1.0
    assert exported[bucket, (("le", "+Inf"), ("model", "m"))] == 1.0


def test_requests_attempts_and_tokens_are_counted_per_label() -> None:
    metrics = RouterMetrics()
    metrics.on_record(_record(0.1, output_tokens=5, finished_s=0.5, attempts=1), "m")
    metrics.on_record(_record(0.1, output_tokens=3, attempts=3, prompt_tokens=None), "m")
    metrics.on_record(
        _record(None, status=504, outcome="timeout", output_tokens=0, prompt_tokens=None), "other"
    )
    text = metrics.render().decode()
    requests = _samples(text, "narwhal_requests")
    ok = (("model", "m"), ("outcome", "ok"), ("status", "200"))
    timed_out = (("model", "other"), ("outcome", "timeout"), ("status", "504"))
    total = "narwhal_requests_total"
    assert requests == {(total, ok): 2.0, (total, timed_out): 1.0}
    assert _samples(text, "narwhal_attempts") == {("narwhal_attempts_total", ()): 6.0}
    generated = _samples(text, "narwhal_generation_tokens")
    assert generated[("narwhal_generation_tokens_total", (("model", "m"),))] == 8.0
    prompts = _samples(text, "narwhal_prompt_tokens")
    assert prompts[("narwhal_prompt_tokens_total", (("model", "m"),))] == 7.0
    assert prompts[("narwhal_prompt_tokens_total", (("model", "other"),))] == 0.0
    # time per output token: successful requests with more than one output only
    tpot = _samples(text, "narwhal_time_per_output_token_seconds")
    assert tpot[("narwhal_time_per_output_token_seconds_count", (("model", "m"),))] == 2.0
    assert tpot[("narwhal_time_per_output_token_seconds_sum", (("model", "m"),))] == (
        (0.5 - 0.1) / 4 + (1.0 - 0.1) / 2
    )
    assert tpot[("narwhal_time_per_output_token_seconds_count", (("model", "other"),))] == 0.0


def test_placements_are_counted_per_engine_and_phase() -> None:
    metrics = RouterMetrics()
    for engine, phase in (("http://p", "prefill"), ("http://c", "decode"), ("http://p", "prefill")):
        metrics.on_decision(Decision(0.0, "place", engine, (("phase", phase),)))
    placed = _samples(metrics.render().decode(), "narwhal_placements")
    assert placed == {
        ("narwhal_placements_total", (("engine", "http://p"), ("phase", "prefill"))): 2.0,
        ("narwhal_placements_total", (("engine", "http://c"), ("phase", "decode"))): 1.0,
    }
