"""Narwhal's configuration: one pydantic model, validated from a mapping (as TOML gives it).

Rule kept here: the key names are part of the interface (README) and unknown keys are refused,
so a typo never silently falls back to a default. Every refusal names the key and the reason.

Theory of operation: :func:`parse_config` validates a mapping (reading the file is the
drivers' part, :mod:`narwhal.config_file`) and raises :class:`ConfigError` whose message lists
each bad key as a dotted path (``recovery.eject_after``, ``engines[1].role``). Cross-field
rules (a fleet needs a producer and a consumer, unique URLs) are checked after the fields
themselves.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from narwhal.core.descriptor import KNOWN_CONNECTORS


class ConfigError(ValueError):
    """A configuration was refused. The message names every bad key and why."""


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"

    @property
    def produces(self) -> bool:
        return self in (Role.PREFILL, Role.BOTH)

    @property
    def consumes(self) -> bool:
        return self in (Role.DECODE, Role.BOTH)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


MAX_DURATION_S = 86_400.0
"""The longest duration a setting may name (a day): anything longer is a typo, or an infinity
spelled out, which would turn a bound into no bound."""


MIN_DURATION_S = 0.001
"""The shortest non-zero duration a setting may name: below a millisecond is a typo."""


def _off_or_at_least_min(value: float) -> float:
    if 0 < value < MIN_DURATION_S:
        raise ValueError(f"must be 0 (off) or at least {MIN_DURATION_S:g} s, got {value!r}")
    return value


# A duration setting is a finite number of seconds (an int or a float, never a boolean or a
# string) up to MAX_DURATION_S.
_Seconds = Annotated[float, Strict(), AllowInfNan(False), Field(le=MAX_DURATION_S)]
Duration = Annotated[_Seconds, Field(ge=MIN_DURATION_S)]
DurationOrOff = Annotated[_Seconds, Field(ge=0), AfterValidator(_off_or_at_least_min)]
"""A duration where 0 means "off"."""
Count = Annotated[int, Strict()]
"""A count setting: an integer, never a boolean, a float or a string."""


class EngineSettings(_Strict):
    """Timeouts of one request (seconds)."""

    first_token_timeout_s: Duration = 30.0
    decode_read_timeout_s: DurationOrOff = 10.0  # 0: the request deadline bounds the stream
    request_timeout_s: Duration = 600.0  # the original request deadline
    max_handoff_age_s: Duration = 25.0
    # what one non-streaming answer may be assembled from (the data of its events); past it
    # the engine's answer is malformed (502). 64 MiB: the logprobs of a long output fit
    max_response_bytes: Annotated[Count, Field(ge=1024, le=1 << 32)] = 64 * 1024 * 1024


class RecoverySettings(_Strict):
    """Breaker, quarantine, ejection cap, retries and probe cadence."""

    eject_after: Annotated[Count, Field(ge=1)] = 3
    failure_quarantine_s: DurationOrOff = 0.0
    # Envoy's max_ejection_percent: at most this share of a role's engines is ejected by the
    # breaker at once, but at least one engine of a role may always be ejected
    max_ejection_percent: Annotated[Count, Field(ge=0, le=100)] = 50
    max_attempts: Annotated[Count, Field(ge=1)] = 1  # 1 = no retries
    retry_budget_ratio: Annotated[float, Strict(), AllowInfNan(False), Field(ge=0, le=1)] = 0.2
    retry_budget_min: Annotated[Count, Field(ge=0)] = 3
    # the background loop ticks at half of it: a floor keeps that from spinning
    probe_interval_s: Annotated[Duration, Field(ge=0.01)] = 5.0
    # after each failed probe the next waits twice as long, up to this many probe intervals
    probe_backoff_cap: Annotated[float, Strict(), AllowInfNan(False), Field(ge=1, le=1000)] = 16.0
    # Envoy's panic threshold: while fewer than this share of a role's engines are in service,
    # placement ignores ejection and spreads over every engine of the role that its health
    # checks have not found down (0: never)
    panic_threshold_percent: Annotated[Count, Field(ge=0, le=100)] = 50
    # tokens a consumer's probe decodes, all within engine.first_token_timeout_s: a consumer
    # that goes silent after fewer tokens than this fails its probe and stays ejected
    probe_decode_tokens: Annotated[Count, Field(ge=1, le=256)] = 8
    # after visible output, a consumer failure resumes the client's stream elsewhere by token
    # replay (narwhal.core.resume); off: the terminal error event, as the contract describes
    resume_streams: Annotated[bool, Strict()] = False
    max_resumes: Annotated[Count, Field(ge=0, le=100)] = 1  # resumes per request
    # no resume once prompt + delivered tokens exceed this many (0: no bound of the router's);
    # also the context length an open-ended chat runs to (set it to the engines' max_model_len)
    resume_max_seq_len: Annotated[Count, Field(ge=0)] = 0


class AdmissionSettings(_Strict):
    """The router's own bounds: requests in flight and what one request body may expand into.

    ``max_requests_in_flight`` bounds the work a burst of arrivals can put on the router (each
    admitted request costs the event loop a few milliseconds to start, and holds its body and
    streams); one past it gets 503 with ``Retry-After: retry_after_s`` at once (docs/live.md).
    """

    max_requests_in_flight: Annotated[Count, Field(ge=1, le=1_000_000)] = 512
    retry_after_s: Annotated[Count, Field(ge=1, le=3600)] = 1  # whole seconds, as the header
    max_body_bytes: Annotated[Count, Field(ge=256, le=1 << 30)] = 4 * 1024 * 1024
    # JSON values (objects, arrays, numbers, strings...) one body may hold: bounds its parsed
    # size (a 4 MiB body of empty objects parses into about 100 MB); 262,144 leaves room for a
    # 256k-token prompt sent as token ids
    max_json_values: Annotated[Count, Field(ge=64, le=100_000_000)] = 262_144


class FlowSettings(_Strict):
    """Flow control (``[flow]``): requests wait in bounded per-priority queues in front of
    admission instead of being refused at ``admission.max_requests_in_flight``; off by default,
    and off the router behaves exactly as without it (narwhal.core.flow, docs/live.md).
    """

    enabled: bool = False
    # the band of a request: this header's integer, else its API key's entry, else the default;
    # a band below zero is sheddable
    priority_header: str = "x-narwhal-priority"
    default_priority: Annotated[int, Strict(), Field(ge=-1000, le=1000)] = 0
    api_key_priorities: dict[str, Annotated[int, Strict(), Field(ge=-1000, le=1000)]] = {}
    fairness_header: str = "x-gateway-inference-fairness-id"
    deadline_header: str = "x-slo-ttft-ms"
    ordering: Literal["fcfs", "edf"] = "fcfs"  # within a flow: arrival order or deadline
    max_queue_per_band: Annotated[Count, Field(ge=1, le=1_000_000)] = 1024
    queue_ttl_s: Duration = 5.0  # a request queued this long gets 503 + Retry-After
    # dispatch waits while every engine is saturated: max(waiting / queue_threshold,
    # kv_usage / kv_threshold) >= 1, a report older than max_report_age_s counting as saturated
    saturation_gate: bool = True
    queue_threshold: Annotated[float, Strict(), Field(gt=0, le=1e6)] = 5.0
    kv_threshold: Annotated[float, Strict(), Field(gt=0, le=1)] = 0.8
    max_report_age_s: Duration = 1.0
    poll_interval_s: Duration = 0.05  # how often a saturation-gated queue looks again
    # drop sheddable (band < 0) arrivals with probability min(saturation^5 * 300, 1)
    probabilistic_shedding: bool = False
    max_bands: Annotated[Count, Field(ge=1, le=64)] = 8  # distinct bands (bounds metric labels)
    # fairness flows with a metric label of their own (the heaviest by traffic, once they have
    # sent flow_label_min_requests); every other flow is counted under "other"
    max_flow_labels: Annotated[Count, Field(ge=0, le=256)] = 16
    flow_label_min_requests: Annotated[Count, Field(ge=1)] = 10

    @field_validator("priority_header", "fairness_header", "deadline_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        lowered = value.strip().lower()
        if not re.fullmatch(r"[a-z0-9!#$%&'*+.^_`|~-]+", lowered):
            raise ValueError(f"{value!r} is not an HTTP header name")
        return lowered


_HOST_NAME = re.compile(r"[a-z0-9.-]+|\[?[0-9a-f:.]+\]?")


def _host_names(names: list[str]) -> list[str]:
    """Host names as the router compares them: lower case, IPv6 without brackets, no port."""
    out = []
    for name in names:
        lowered = name.strip().lower()
        if not lowered or not _HOST_NAME.fullmatch(lowered) or lowered.count(":") == 1:
            raise ValueError(f"{name!r} is not a host name or IP address (without a port)")
        out.append(lowered.strip("[]"))
    return out


class ClientSettings(_Strict):
    """How long the router waits on a client, and which clients it serves at all (seconds)."""

    # the longest one write to the client may stay blocked (the client's receive window full);
    # then the client is cut off, as its own fault. 0: only the request deadline bounds it
    write_timeout_s: DurationOrOff = 30.0
    # the edge (narwhal.live.h1server): a request head must arrive within head_timeout_s of
    # its first byte, its body within body_timeout_s of its head (0: no bound); a connection
    # with no request in progress is closed after idle_timeout_s
    head_timeout_s: DurationOrOff = 10.0
    body_timeout_s: DurationOrOff = 60.0
    idle_timeout_s: Duration = 5.0
    # client connections held open at once; one more is closed as soon as it is accepted
    max_connections: Annotated[Count, Field(ge=1, le=1_000_000)] = 4096
    # Host names (no port) the router answers; empty: any (against DNS rebinding)
    allowed_hosts: Annotated[list[str], AfterValidator(_host_names)] = []


class TracingSettings(_Strict):
    """OpenTelemetry tracing of the live router (the ``otel`` extra; docs/live.md, Tracing).

    ``exporter``: ``otlp`` sends spans over OTLP/HTTP to ``otlp_endpoint`` (empty: the
    standard ``OTEL_EXPORTER_OTLP_*`` environment variables, else localhost:4318); ``console``
    writes them to stderr (stdout holds only the JSON log lines).
    """

    enabled: Annotated[bool, Strict()] = False
    exporter: Literal["otlp", "console"] = "otlp"
    otlp_endpoint: str = ""  # e.g. http://otel-collector:4318/v1/traces
    service_name: str = Field(default="narwhal", min_length=1)


class EngineContract(_Strict):
    """What every engine must be; checked by preflight and on breaker readmission."""

    model: str = Field(min_length=1)
    vllm_version: str = Field(min_length=1)
    kv_connector: str = "NixlConnector"

    @field_validator("kv_connector")
    @classmethod
    def _known_connector(cls, value: str) -> str:
        if value not in KNOWN_CONNECTORS:
            raise ValueError(
                f"unknown connector {value!r}; expected one of {list(KNOWN_CONNECTORS)}"
            )
        return value


def _check_host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be 'host:port' with a port in 1..65535, got {value!r}")
    return value


# a DNS name or IPv4 address, or an IPv6 address (urlsplit drops its brackets)
_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+")


class EngineEntry(_Strict):
    """One engine of the fleet."""

    url: str
    role: Role
    kv_endpoint: str | None = None  # the producer's KV side channel, pinned in descriptors
    # the engine's KV cache event publisher (vLLM --kv-events-config "endpoint", as dialled
    # from the router: "tcp://HOST:PORT"), its replay socket ("replay_endpoint") and topic;
    # read by kv_aware (narwhal.live.kv_events)
    kv_events: str | None = None
    kv_events_replay: str | None = None
    kv_events_topic: str = ""

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _zmq_tcp(cls, value: str | None) -> str | None:
        """A ZMQ endpoint the router can dial: tcp://HOST:PORT (no wildcard host) or
        ipc://PATH (a Unix socket: vLLM binds its publisher only on a wildcard or ipc endpoint)."""
        if value is None:
            return None
        if value.startswith("ipc://") and len(value) > 6 and not any(c.isspace() for c in value):
            return value
        match = re.fullmatch(r"tcp://([^\s:*/]+|\[[0-9a-fA-F:.]+\]):(\d{1,5})", value)
        if match is None or not 1 <= int(match.group(2)) <= 65535:
            raise ValueError(
                f"must be a ZMQ endpoint like 'tcp://127.0.0.1:5557' or 'ipc:///run/kv.sock', "
                f"got {value!r}"
            )
        return value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        """Refuse what could never be dialled; normalise the rest (lower-case scheme and host,
        no trailing slash) so one engine cannot be listed twice under two spellings."""
        parts = urlsplit(value.strip())
        scheme = parts.scheme.lower()
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port out of range 1-65535 in {value!r}")
        host = parts.hostname
        if scheme not in ("http", "https") or not host:
            raise ValueError(f"must be an http(s) URL like 'http://127.0.0.1:8100', got {value!r}")
        if any(c.isspace() for c in value.strip()) or not _HOST.fullmatch(host):
            raise ValueError(f"not a valid host in {value!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "must not carry credentials: they would show in /status, /metrics and the logs"
            )
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"must be the engine's base URL without a path, got {value!r}")
        netloc = f"[{host}]" if ":" in host else host
        return f"{scheme}://{netloc}" + (f":{port}" if port is not None else "")

    @field_validator("kv_endpoint")
    @classmethod
    def _kv_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else _check_host_port(value)


RoutingPolicyName = Literal[
    "least_reserved",
    "round_robin",
    "random",
    "power_of_two",
    "least_loaded",
    "prefix_affinity",
    "kv_aware",
]
"""The routing policies a phase can use (narwhal.core.routing); the names are the interface."""

Weight = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0)]
"""A non-negative finite weight (an int or a float, never a boolean or a string)."""


class LeastLoadedSettings(_Strict):
    """``least_loaded``: engines ranked by the load they report (vLLM's /metrics gauges).

    An engine's score is ``waiting_weight * num_requests_waiting + running_weight *
    num_requests_running + kv_cache_weight * kv_cache_usage_perc``, each placement made on it
    since its report counting as one more waiting request; the lowest score wins."""

    # a report older than this counts as unknown; with any candidate's load unknown, the choice
    # is least_reserved
    max_report_age_s: Duration = 2.0
    # how often each engine's load is read: the live router scrapes GET /metrics, the simulated
    # engine reports its true load at this period (both only while a phase uses least_loaded)
    scrape_interval_s: Duration = 0.5
    waiting_weight: Weight = 1.0
    running_weight: Weight = 1.0
    kv_cache_weight: Weight = 1.0  # kv_cache_usage_perc is 0..1: a full cache counts as 1

    @model_validator(mode="after")
    def _scraped_before_stale(self) -> LeastLoadedSettings:
        if self.scrape_interval_s >= self.max_report_age_s:
            raise ValueError(
                f"scrape_interval_s ({self.scrape_interval_s:g}) must be below "
                f"max_report_age_s ({self.max_report_age_s:g}): otherwise every report is "
                "stale before the next one arrives"
            )
        return self


class PrefixAffinitySettings(_Strict):
    """``prefix_affinity``: the engine that has seen the longest prefix of the prompt wins."""

    # characters (UTF-8 bytes) of the rendered prompt per hashed block: the router's estimate
    # of vLLM's block of tokens
    block_size: Annotated[Count, Field(ge=1, le=65_536)] = 16
    max_blocks_per_engine: Annotated[Count, Field(ge=1, le=10_000_000)] = 32_768
    # the longest match is overridden (least_reserved instead) when the engine it picks holds
    # more than this many reservations of the phase above the least reserved candidate; 2 from
    # the routing recipe (docs/experiments.md, Routing): 8 let long prompts queue behind each
    # other on one producer, 0 gave up most of the cache hits
    imbalance_threshold: Annotated[Count, Field(ge=0)] = 2


class KvAwareSettings(_Strict):
    """``kv_aware``: one cost per engine from the blocks its KV events say it holds and its load
    (narwhal.core.routing.kv_aware); the lowest cost wins (or, with a temperature, a softmax
    draw over the negated costs)."""

    # cost = overlap_weight x the prompt's blocks the engine does not hold
    #      + load_weight x the engine's requests (this router's reservations of the phase on it)
    overlap_weight: Weight = 1.0
    # a request in flight costs as much as this many uncached blocks to prefill (64 blocks of
    # 16 tokens: a 1,024-token prompt); not tuned yet
    load_weight: Weight = 64.0
    temperature: Weight = 0.0  # 0: the lowest cost (ties by the seeded RNG)
    # a placed prompt's blocks count as held on its engine for this long, or until the engine's
    # events confirm them
    speculative_ttl_s: Duration = 2.0
    max_blocks_per_engine: Annotated[Count, Field(ge=1, le=100_000_000)] = 1_000_000
    max_blocks_total: Annotated[Count, Field(ge=1, le=1_000_000_000)] = 4_000_000
    # the engines' block identity (narwhal.core.routing.block_identity), as they are started:
    # --block-size, --prefix-caching-hash-algo, PYTHONHASHSEED (None: unset) and
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (vLLM's default 1: int hashes in the events)
    block_size: Annotated[Count, Field(ge=1, le=4096)] = 16
    hash_algo: Literal["sha256", "sha256_cbor"] = "sha256"
    hash_seed: str | None = None
    int_block_hashes: bool = True
    # text and chat prompts carry no token ids: ask an engine's /tokenize for them before
    # placement (narwhal.core.routing.prompt_tokens), bounded by tokenize_timeout_s; off: such
    # prompts are placed on load alone
    tokenize: bool = False
    tokenize_timeout_s: Duration = 0.5


NoProducer = Literal["fail", "local"]
"""What a request gets when no producer is placeable: 503 + Retry-After, or a local prefill."""

PrefillFallback = Literal["none", "local"]
"""What a request gets when every producer attempt it may make failed: the last fault's status,
or a prefill by its consumer (narwhal.core.retry.falls_back_locally)."""


class RoutingSettings(_Strict):
    """Which routing policy places each phase, the policies' parameters, and which requests are
    disaggregated at all (narwhal.core.routing.disagg)."""

    prefill: RoutingPolicyName = "least_reserved"
    decode: RoutingPolicyName = "least_reserved"
    # a prompt whose estimated uncached length is below this is prefilled by its consumer (the
    # contract's same-worker path); 0: every prompt is prefilled on a producer
    remote_prefill_min_tokens: Annotated[Count, Field(ge=0, le=10_000_000)] = 0
    no_producer: NoProducer = "fail"
    prefill_fallback: PrefillFallback = "none"
    least_loaded: LeastLoadedSettings = LeastLoadedSettings()
    prefix_affinity: PrefixAffinitySettings = PrefixAffinitySettings()
    kv_aware: KvAwareSettings = KvAwareSettings()


class NarwhalConfig(_Strict):
    """The whole configuration. Defaults are the documented ones (README)."""

    engine: EngineSettings = EngineSettings()
    recovery: RecoverySettings = RecoverySettings()
    routing: RoutingSettings = RoutingSettings()
    admission: AdmissionSettings = AdmissionSettings()
    flow: FlowSettings = FlowSettings()
    client: ClientSettings = ClientSettings()
    tracing: TracingSettings = TracingSettings()
    engine_contract: EngineContract | None = None
    engines: list[EngineEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _fleet_is_usable(self) -> NarwhalConfig:
        urls = [e.url for e in self.engines]
        for url in sorted({u for u in urls if urls.count(u) > 1}):
            raise ValueError(f"engines: url {url!r} is listed more than once")
        if not any(e.role.produces for e in self.engines):
            raise ValueError("engines: no engine can prefill (need role 'prefill' or 'both')")
        if not any(e.role.consumes for e in self.engines):
            raise ValueError("engines: no engine can decode (need role 'decode' or 'both')")
        return self

    @property
    def kv_connector(self) -> str:
        """The connector descriptors are validated against (NixlConnector unless pinned)."""
        return self.engine_contract.kv_connector if self.engine_contract else "NixlConnector"

    def engine_by_url(self, url: str) -> EngineEntry:
        for entry in self.engines:
            if entry.url == url:
                return entry
        raise KeyError(url)


UNKNOWN_KEY = "unknown key (check the spelling against the configuration reference)"


def key_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """A pydantic error location as a dotted key path: ``engines[1].role``."""
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The one model an annotation holds (``X``, ``X | None``, ``list[X]``, ``tuple[X, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = {m for arg in get_args(annotation) if (m := _model_in(arg)) is not None}
    return found.pop() if len(found) == 1 else None


def valid_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str] | None:
    """The keys the table at ``loc`` takes, or None where the path leaves known models."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue  # an array's element: the same model as the array's
        field = current.model_fields.get(part) if current else None
        current = _model_in(field.annotation) if field else None
    return sorted(current.model_fields) if current else None


def validation_problems(
    error: ValidationError,
    *,
    prefix: str = "",
    unknown_key: str = UNKNOWN_KEY,
    model: type[BaseModel] | None = None,
) -> list[str]:
    """One ``  key: reason`` line per problem, for every TOML-backed model of Narwhal; an
    unknown key's line lists the keys its table takes when ``model`` (the validated one) says."""
    lines = []
    for item in error.errors():
        reason = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            reason = unknown_key
            keys = valid_keys(model, item["loc"][:-1]) if model else None
            if keys:
                reason += f"; valid keys: {', '.join(keys)}"
        elif item["type"] == "missing":
            reason = "required key is missing"
        elif item["type"].endswith(("_type", "_parsing", "finite_number")):
            reason += f" (got {item['input']!r})"  # e.g. true, "30" or inf where seconds go
        lines.append(f"  {key_path(item['loc'], prefix)}: {reason}")
    return lines


def _format(error: ValidationError, source: str) -> str:
    problems = validation_problems(error, model=NarwhalConfig)
    return "\n".join([f"invalid configuration in {source}:", *problems])


def parse_config(data: dict[str, Any], source: str = "<config>") -> NarwhalConfig:
    """Validate a mapping (as read from TOML) into a :class:`NarwhalConfig`."""
    try:
        return NarwhalConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format(error, source)) from None
