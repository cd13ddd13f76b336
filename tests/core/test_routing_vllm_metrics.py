"""vLLM's /metrics text read as an EngineLoad: the gauges, the model filter, data-parallel
engine cores, the legacy KV name, and every kind of bad page refused with a reason."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.routing.load import EngineLoad
from narwhal.core.routing.vllm_metrics import MAX_METRICS_BYTES, MetricsRefused, engine_load

# the shape a vLLM 0.32 server writes (prometheus_client exposition), two engine cores
PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="tiny-llama"} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 1234.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny-llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny-llama"} 0.42
"""


def page(waiting: str = "1.0", running: str = "2.0", kv: str = "0.5", model: str = "m") -> str:
    labels = f'engine="0",model_name="{model}"'
    return (
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv}\n"
    )


def test_a_vllm_page_sums_the_requests_of_its_engine_cores_and_averages_kv_usage() -> None:
    assert engine_load(PAGE) == EngineLoad(2.0, 4.0, 0.375)
    assert engine_load(PAGE.encode(), "tiny-llama") == EngineLoad(2.0, 4.0, 0.375)


def test_only_the_pinned_models_samples_count() -> None:
    mixed = page("5", "5", "0.9", model="other") + page("1", "2", "0.5", model="tiny-llama")
    assert engine_load(mixed, "tiny-llama") == EngineLoad(1.0, 2.0, 0.5)
    assert engine_load(mixed) == EngineLoad(6.0, 7.0, 0.7)  # no pinned model: every sample
    with pytest.raises(MetricsRefused, match="no vllm:num_requests_waiting sample for model 'x'"):
        engine_load(mixed, "x")


def test_the_legacy_kv_name_is_read_only_when_the_current_one_is_absent() -> None:
    legacy = page().replace("kv_cache_usage_perc", "gpu_cache_usage_perc")
    assert engine_load(legacy).kv_cache_usage_perc == 0.5
    both = page(kv="0.25") + legacy
    assert engine_load(both).kv_cache_usage_perc == 0.25


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (page(waiting="NaN"), "num_requests_waiting must be finite"),
        (page(running="-1"), "num_requests_running must be finite and at least 0"),
        (page(running="+Inf"), "num_requests_running must be finite"),
        (page(kv="1.5"), "kv_cache_usage_perc is a fraction"),
        (page(kv="zero"), "not Prometheus text"),
        ("vllm:num_requests_waiting{engine=0} 1\n", "not Prometheus text"),
        (
            page().replace("vllm:num_requests_running", "vllm:num_requests_runnin"),
            "no vllm:num_requests_running sample",
        ),
        (
            page().replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage"),
            "no vllm:kv_cache_usage_perc sample",
        ),
        ("", "no vllm:num_requests_waiting sample"),
        ("<html>502 Bad Gateway</html>", "no vllm:num_requests_waiting sample"),
    ],
)
def test_a_page_without_a_usable_load_is_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(MetricsRefused, match=reason):
        engine_load(text)


def test_a_page_that_is_not_utf8_or_too_large_is_refused_unread() -> None:
    with pytest.raises(MetricsRefused, match="not UTF-8"):
        engine_load(b"\xff\xfe" + page().encode())
    with pytest.raises(MetricsRefused, match=f"over {MAX_METRICS_BYTES} bytes"):
        engine_load(page() + "#" * MAX_METRICS_BYTES)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from([*list('vlm:_{}="0.1 \n#,+-eIfNa'), "\\", "é"])))
def test_any_text_gives_a_load_or_a_refusal(text: str) -> None:
    try:
        load = engine_load(page() + text)
    except MetricsRefused:
        return
    assert isinstance(load, EngineLoad)


def _full_parse(text: str, model: str) -> EngineLoad:
    """The load from prometheus_client's parse of the whole page (no lines dropped)."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") == model:
                values.setdefault(sample.name, []).append(sample.value)
    kv = values["vllm:kv_cache_usage_perc"]
    return EngineLoad(
        sum(values["vllm:num_requests_waiting"]),
        sum(values["vllm:num_requests_running"]),
        sum(kv) / len(kv),
    )


@settings(max_examples=40, deadline=None)
@given(
    cores=st.integers(1, 3),
    waiting=st.integers(0, 500),
    running=st.integers(0, 500),
    kv=st.floats(0, 1),
    other_families=st.integers(0, 6),
)
def test_reading_only_the_needed_lines_matches_a_parse_of_the_whole_page(
    cores: int, waiting: int, running: int, kv: float, other_families: int
) -> None:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    gauges = {
        name: Gauge(name, "doc", labels, registry=registry)
        for name in (
            "vllm:num_requests_waiting",
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:num_requests_waiting_by_reason",
        )
    }
    for index in range(other_families):
        histogram = Histogram(f"vllm:h{index}_seconds", "doc", labels, registry=registry)
        histogram.labels("m", "0").observe(0.1)
    for core in range(cores):
        gauges["vllm:num_requests_waiting"].labels("m", str(core)).set(waiting)
        gauges["vllm:num_requests_running"].labels("m", str(core)).set(running)
        gauges["vllm:kv_cache_usage_perc"].labels("m", str(core)).set(kv)
        gauges["vllm:num_requests_waiting_by_reason"].labels("m", str(core)).set(99)
        gauges["vllm:num_requests_running"].labels("other", str(core)).set(7)
    text = generate_latest(registry).decode()
    assert engine_load(text, "m") == _full_parse(text, "m")
