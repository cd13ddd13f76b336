"""vLLM's ``/metrics`` text read as an :class:`~narwhal.core.routing.load.EngineLoad`.

Rule kept here: a page yields a load only when every gauge ``least_loaded`` reads is there, for
the served model, with a valid value; anything else is refused with a :class:`MetricsRefused`
that says why, so a driver keeps the engine's previous report (which then goes stale) instead
of inventing a load. Pure: text in, a value or a refusal out.

Theory of operation: vLLM (0.32, ``vllm/v1/metrics/loggers.py``) exports per engine core the
gauges ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and
``vllm:kv_cache_usage_perc`` (a fraction, 1 = full), labelled ``model_name`` (the served model
name) and ``engine`` (the data-parallel rank); releases before 0.10 named the last one
``vllm:gpu_cache_usage_perc``, read when the current name is absent. The page is bounded
(:data:`MAX_METRICS_BYTES`) and cut to the lines of those families before parsing: the text
format is one sample per line, and the whole page of a vLLM server (about 1,400 lines of
histograms) takes prometheus_client's parser some 70 ms, against under a millisecond for the
few lines read here. The rest is prometheus_client's text parser. With several engine cores
behind one URL the waiting and running requests are summed and the KV usage averaged; with a
pinned model only its samples count.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from narwhal.core.routing.load import EngineLoad

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
LEGACY_KV_USAGE = "vllm:gpu_cache_usage_perc"  # vLLM before 0.10
_READ = (WAITING, RUNNING, KV_USAGE, LEGACY_KV_USAGE)
_COMMENTS = ("# HELP ", "# TYPE ")

MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A longer page is refused unread (a vLLM server's is about 100 KB per engine core)."""


class MetricsRefused(ValueError):
    """The page gave no usable load; the message says why."""


def _wanted_lines(text: str) -> str:
    """The sample, HELP and TYPE lines of the families read here (a name that only begins
    with one of them, e.g. ``vllm:num_requests_waiting_by_reason``, is dropped after parsing)."""
    kept = []
    for line in text.splitlines():
        if line.startswith(_READ) or (line.startswith(_COMMENTS) and line[7:].startswith(_READ)):
            kept.append(line)
    return "\n".join(kept) + "\n"


def _values(text: str, model: str | None) -> dict[str, list[float]]:
    """Sample values per family read here, of ``model`` only when it is given."""
    values: dict[str, list[float]] = {name: [] for name in _READ}
    try:
        for family in text_string_to_metric_families(_wanted_lines(text)):
            for sample in family.samples:
                if sample.name not in values:
                    continue
                if model is not None and sample.labels.get("model_name") != model:
                    continue
                values[sample.name].append(float(sample.value))
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise MetricsRefused(f"not Prometheus text: {error}") from None
    return values


def engine_load(body: bytes | str, model: str | None = None) -> EngineLoad:
    """The load a vLLM ``/metrics`` page reports (of the served ``model``, if pinned)."""
    if len(body) > MAX_METRICS_BYTES:
        raise MetricsRefused(f"metrics page over {MAX_METRICS_BYTES} bytes")
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise MetricsRefused(f"metrics page is not UTF-8: {error}") from None
    else:
        text = body
    values = _values(text, model)
    kv = values[KV_USAGE] or values[LEGACY_KV_USAGE]
    whose = f" for model {model!r}" if model is not None else ""
    for name, found in ((WAITING, values[WAITING]), (RUNNING, values[RUNNING]), (KV_USAGE, kv)):
        if not found:
            raise MetricsRefused(f"no {name} sample{whose}")
    try:
        return EngineLoad(
            num_requests_waiting=sum(values[WAITING]),
            num_requests_running=sum(values[RUNNING]),
            kv_cache_usage_perc=sum(kv) / len(kv),
        )
    except ValueError as error:
        raise MetricsRefused(str(error)) from None
