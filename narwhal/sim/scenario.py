"""Scenarios: one TOML file = the router's configuration + a fleet, a workload, faults and run
settings.

Rule kept here: the router part is the core's :class:`~narwhal.core.config.NarwhalConfig`,
with the same key names and validation as a live deployment (``[engine]``, ``[recovery]``,
``[engine_contract]``, ``[[engines]]``); the simulator's own sections (``[fleet]``,
``[workload]``, ``[[faults]]``, ``[sim]``) are pydantic models that refuse unknown keys. Every
refusal is a :class:`ScenarioError` naming each bad key as a dotted path.

Theory of operation: :func:`load_scenario` reads TOML (or the embedded default,
``narwhal/sim/scenarios/default.toml``) and :func:`parse_scenario` validates it. When
``[[engines]]`` is absent the fleet is generated from ``[fleet]`` counts as synthetic URLs
(``http://sim-p0``, ``http://sim-d0``, ``http://sim-b0``); when present, its URLs and roles are
used as given.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from narwhal.config_file import parse_toml, read_toml
from narwhal.core.config import ConfigError, NarwhalConfig, parse_config, validation_problems
from narwhal.sim.faults import FaultSpec, targets
from narwhal.sim.gpu.params import EngineParams
from narwhal.sim.model_shape import ModelShape, model_shape
from narwhal.sim.profiles import store as profiles
from narwhal.sim.profiles.gpus import GPUS
from narwhal.sim.profiles.opstep import capture_sizes
from narwhal.sim.profiles.source import ProfileError
from narwhal.sim.replicas import RouterReplicaSettings
from narwhal.sim.tensor_parallel import (
    NVLINK_H200_BUS_GBPS,
    NVLINK_H200_LATENCY_US,
    with_allreduce,
)
from narwhal.sim.timing import LinearStepTiming, StepTiming, model_names, step_model
from narwhal.sim.vllm_defaults import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    BatchDefaults,
    KvCacheBudget,
    UsageContext,
    batch_defaults,
    departures,
    kv_cache_budget,
)
from narwhal.sim.workload import WorkloadSettings

ROUTER_KEYS = ("engine", "recovery", "routing", "admission", "flow", "engine_contract", "engines")
DEFAULT_SCENARIO = "default.toml"


class ScenarioError(ValueError):
    """A scenario was refused; the message names every bad key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinearTimingSettings(_Strict):
    """``[fleet.linear]``: the live emulator's linear timing (``narwhal emulate`` flags)."""

    prefill_s_per_token: float = Field(0.0, ge=0)
    decode_s_per_token: float = Field(0.0, ge=0)
    kv_s_per_token: float = Field(0.0, ge=0)
    overhead_s: float = Field(0.0, ge=0)
    decode_s_per_seq: float = Field(0.0, ge=0)  # per running decode beyond the first, per step
    kv_setup_s: float = Field(0.0, ge=0)  # fixed time of every KV pull


# [fleet] keys that the linear timing replaces (refused with it rather than silently unused);
# the step noise (jitter, straggler_rate, straggler_factor) applies to both timings
_FITTED_ONLY = (
    "step_overhead_ms",
    "step_overhead_per_seq_us",
    "step_overhead_per_token_us",
    "link_bandwidth_gbps",
    "link_setup_ms",
    "topology",
    "tp_allreduce",
    "tp_allreduce_gbps",
    "tp_allreduce_latency_us",
)


class FleetSettings(_Strict):
    """``[fleet]``: how many engines and what each one is."""

    prefill: int = Field(0, ge=0)
    decode: int = Field(0, ge=0)
    both: int = Field(0, ge=0)
    # "H200": the closed-form model fitted to the bundled H200 microbenchmark (models llama3-8b,
    # llama3-70b-tp4); any other: a bundled per-operator profile of that GPU (narwhal/sim/
    # profiles), with `model` its Hugging Face id (e.g. gpu = "RTXPRO6000", model =
    # "meta-llama/Llama-3.1-8B")
    gpu: str = "H200"
    model: str = "llama3-8b"
    # a per-operator profile file (`narwhal profile import`) instead of the bundled one of
    # `gpu` and `model` (which must name its GPU and model)
    profile: str | None = None
    tensor_parallel: int = Field(1, ge=1)  # per-operator profiles: the engine's TP degree
    cuda_graphs: bool = True  # per-operator profiles: vLLM's default CUDA graphs (else eager)
    # per-operator profiles: vLLM's cudagraph_capture_sizes (None: its default rule)
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    # None: vLLM's defaults for the GPU and the usage context (narwhal/sim/vllm_defaults.py)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=16)
    block_size: int = Field(16, ge=1)
    kv_cache_tokens: int | None = Field(None, ge=64)  # None: vLLM's sizing from GPU memory
    # as torch reports it (vLLM's batch defaults check "a100"); None: the `gpu`'s own
    gpu_name: str | None = None
    gpu_memory_gb: float | None = Field(None, gt=0)  # total, 1e9 bytes; None: the `gpu`'s own
    gpu_memory_utilization: float = Field(DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1)
    usage_context: UsageContext = "api_server"  # vllm serve; "llm_class": vllm.LLM(...)
    # tensor-parallel all-reduce (TP > 1 models): NCCL bus bandwidth GB/s and latency per call;
    # tp_allreduce = false leaves it out (the one-shard step alone, as the profile measured it)
    tp_allreduce: bool = True
    tp_allreduce_gbps: float = Field(NVLINK_H200_BUS_GBPS, gt=0)
    tp_allreduce_latency_us: float = Field(NVLINK_H200_LATENCY_US, ge=0)
    step_overhead_ms: float = Field(2.0, ge=0)  # host work of every step
    step_overhead_per_seq_us: float = Field(0.0, ge=0)  # host work per scheduled sequence
    step_overhead_per_token_us: float = Field(0.0, ge=0)  # host work per scheduled token
    jitter: float = Field(0.05, ge=0, lt=1)  # step noise body: uniform(1 - jitter, 1 + jitter)
    straggler_rate: float = Field(0.0, ge=0, lt=1)  # the chance that a step is a straggler
    straggler_factor: float = Field(1.0, ge=1)  # how many times longer a straggler step takes
    stream_interval: int = Field(1, ge=1)
    kv_lease_s: float = Field(30.0, gt=0)
    kv_load_failure_policy: Literal["fail", "recompute"] = "fail"
    prefix_caching: bool = True  # vLLM V1's automatic prefix caching (on by default, as in vLLM)
    # vLLM's async scheduling (on by default since vLLM 0.14): each step is planned while the
    # one before it runs, so an arrival waits one more step and a finished sequence holds its
    # seat one more step
    async_scheduling: bool = False
    link_bandwidth_gbps: float = Field(40.0, gt=0)  # GB/s per link
    link_setup_ms: float = Field(1.0, ge=0)
    topology: Literal["per_consumer", "shared"] = "per_consumer"
    # "fitted": the step model fitted to the H200 profile; "linear": the emulator's timing
    timing: Literal["fitted", "linear"] = "fitted"
    linear: LinearTimingSettings | None = None  # with timing = "linear" (default: all zero)
    # a profile already read, handed to :func:`parse_scenario` (a replay of a real run with an
    # LLMServingSim profile directory): used instead of `profile` or the bundled one
    _given_profile: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> FleetSettings:
        given = (info.context or {}).get("profile")
        if given is not None:
            self._given_profile = given
        own_profile = self.profile is not None or self._given_profile is not None
        if self.gpu not in GPUS and (
            not own_profile or self.gpu_name is None or self.gpu_memory_gb is None
        ):
            raise ValueError(
                f"gpu {self.gpu!r} is not known; known: {', '.join(sorted(GPUS))} (another GPU "
                "needs its own profile, gpu_name and gpu_memory_gb)"
            )
        if (
            self.gpu not in GPUS
            and self.tensor_parallel > 1
            and not {"tp_allreduce_gbps", "tp_allreduce_latency_us"} <= self.model_fields_set
        ):
            raise ValueError(
                f"gpu {self.gpu!r} with tensor_parallel > 1 needs tp_allreduce_gbps and "
                "tp_allreduce_latency_us"
            )
        if self.fitted_h200:
            if own_profile:
                raise ValueError("profile: the H200 uses its closed-form model; name the GPU")
            if self.model not in model_names():
                raise ValueError(f"model {self.model!r} is not in the profile ({model_names()})")
            profile_only = {"tensor_parallel", "cuda_graphs", "cudagraph_capture_sizes"}
            if profile_only & self.model_fields_set:
                raise ValueError(
                    "tensor_parallel, cuda_graphs and cudagraph_capture_sizes are for "
                    "per-operator profiles; on the H200 the model names its TP degree "
                    "(llama3-70b-tp4)"
                )
        else:
            try:
                profile = self.op_profile()
            except ProfileError as error:
                raise ValueError(str(error)) from None
            if (profile["gpu"], profile["model"]) != (self.gpu, self.model):
                raise ValueError(
                    f"profile {self.profile or '(given)'} is of {profile['model']} on "
                    f"{profile['gpu']}, not of {self.model} on {self.gpu}"
                )
            if self.timing == "linear":
                raise ValueError('timing = "linear" needs gpu = "H200"')
        batch = self.batch()
        if batch.max_num_batched_tokens < batch.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({batch.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({batch.max_num_seqs})"
            )
        sizes = self.cudagraph_capture_sizes
        if sizes is not None and (not sizes or min(sizes) < 1):
            raise ValueError("cudagraph_capture_sizes: batch sizes of at least 1")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 8 * self.block_size:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must hold at least 8 blocks of "
                f"block_size ({8 * self.block_size} tokens)"
            )
        if self.timing == "fitted" and self.linear is not None:
            raise ValueError('[fleet.linear] needs timing = "linear"')
        if self.timing == "linear":
            unused = sorted(set(_FITTED_ONLY) & self.model_fields_set)
            if unused:
                raise ValueError(
                    f'{", ".join(unused)}: not used with timing = "linear" (its overhead is '
                    "[fleet.linear]'s; KV pulls take linear.kv_s_per_token per token)"
                )
        return self

    @property
    def fitted_h200(self) -> bool:
        """Whether the engines use the closed-form H200 model (else a per-operator profile)."""
        return self.gpu == "H200"

    def op_profile(self) -> dict[str, Any]:
        """The per-operator profile the engines are timed by (not for the H200)."""
        if self._given_profile is not None:
            return self._given_profile
        if self.profile is not None:
            return profiles.read_cached(self.profile)
        return profiles.bundled(self.gpu, self.model)

    @property
    def gpu_memory_bytes(self) -> int:
        if self.gpu_memory_gb is None:
            return GPUS[self.gpu].memory_bytes
        return round(self.gpu_memory_gb * 1e9)

    @property
    def device_name(self) -> str:
        return self.gpu_name if self.gpu_name is not None else GPUS[self.gpu].name

    def shape(self) -> ModelShape:
        """The served model's shape (sizes for memory, TP and KV transfers)."""
        if self.fitted_h200:
            return model_shape(self.model)
        config = profiles.model_config(self.op_profile())
        return config.shape(self.tensor_parallel, self.model)

    def batch(self) -> BatchDefaults:
        """The sequence cap and token budget: as given, else vLLM's defaults for the GPU."""
        return batch_defaults(
            self.gpu_memory_bytes,
            self.device_name,
            self.usage_context,
            self.max_num_seqs,
            self.max_num_batched_tokens,
        )

    def kv_budget(self) -> KvCacheBudget:
        """vLLM's KV-cache sizing on one rank of this GPU, for this model and batch."""
        batch = self.batch()
        return kv_cache_budget(
            self.shape(),
            self.gpu_memory_bytes,
            self.gpu_memory_utilization,
            self.block_size,
            batch.max_num_batched_tokens,
            batch.max_num_seqs,
        )

    def vllm_notes(self) -> list[str]:
        """A note for each engine setting that departs from what vLLM would use here."""
        vllm = batch_defaults(self.gpu_memory_bytes, self.device_name, self.usage_context)
        given: dict[str, float | int | None] = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        defaults: dict[str, float | int] = {
            "max_num_seqs": vllm.max_num_seqs,
            "max_num_batched_tokens": vllm.max_num_batched_tokens,
            "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION,
        }
        if self.kv_cache_tokens is not None:
            given["kv_cache_tokens"] = self.kv_cache_tokens
            sized = self.model_copy(update={"kv_cache_tokens": None}).kv_budget()
            defaults["kv_cache_tokens"] = sized.num_blocks * self.block_size
        return departures(self.device_name, given, defaults) + self.profile_range_notes()

    def profile_range_notes(self) -> list[str]:
        """What the engines run past their per-operator profile's measurements (extrapolated:
        the last measured slope continues), one note each; none for the H200's closed form."""
        if self.fitted_h200:
            return []
        tables = self.op_profile()["tp"].get(str(self.tensor_parallel), {})
        measured_tokens = max(
            (int(size) for points in tables.get("dense", {}).values() for size, _ in points),
            default=0,
        )
        measured_seqs = max((int(n) for _, _, n, _, _ in tables.get("attention", [])), default=0)
        batch = self.batch()
        notes = []
        if batch.max_num_batched_tokens > measured_tokens:
            notes.append(
                f"max_num_batched_tokens {batch.max_num_batched_tokens} is past the {self.gpu} "
                f"profile's largest measured step ({measured_tokens} tokens): extrapolated"
            )
        if batch.max_num_seqs > measured_seqs:
            notes.append(
                f"max_num_seqs {batch.max_num_seqs} is past the {self.gpu} profile's largest "
                f"measured decode batch ({measured_seqs}): extrapolated"
            )
        return notes

    def step_timing(self) -> StepTiming:
        """The engines' timing model: fitted to the profile (plus the all-reduces of a TP > 1
        model), the per-operator profile of the GPU, or the emulator's linear one."""
        if not self.fitted_h200:
            shape = self.shape()
            batch = self.batch()
            if not self.cuda_graphs:
                graphs: tuple[int, ...] = ()
            elif self.cudagraph_capture_sizes:
                graphs = tuple(sorted(set(self.cudagraph_capture_sizes)))
            else:
                graphs = capture_sizes(batch.max_num_seqs)
            timing = profiles.timing(self.op_profile(), shape.tp, graphs)
            if not self.tp_allreduce:
                return timing
            gbps, latency_us = self.tp_allreduce_gbps, self.tp_allreduce_latency_us
            link = GPUS.get(self.gpu)  # the GPU's link, unless the scenario states its own
            if link is not None and "tp_allreduce_gbps" not in self.model_fields_set:
                gbps = link.allreduce_gbps
            if link is not None and "tp_allreduce_latency_us" not in self.model_fields_set:
                latency_us = link.allreduce_latency_us
            return with_allreduce(timing, shape, gbps, latency_us / 1e6)
        fitted = step_model(self.model)
        if self.timing == "fitted" and not self.tp_allreduce:
            return fitted
        if self.timing == "fitted":
            return with_allreduce(
                fitted,
                self.shape(),
                self.tp_allreduce_gbps,
                self.tp_allreduce_latency_us / 1e6,
            )
        linear = self.linear or LinearTimingSettings()
        return LinearStepTiming(
            prefill_s_per_token=linear.prefill_s_per_token,
            decode_s_per_token=linear.decode_s_per_token,
            kv_s_per_token=linear.kv_s_per_token,
            overhead_s=linear.overhead_s,
            kv_bytes_per_token=fitted.kv_bytes_per_token,
            decode_s_per_seq=linear.decode_s_per_seq,
            kv_setup_s=linear.kv_setup_s,
        )

    def engine_params(self) -> EngineParams:
        batch = self.batch()
        if self.kv_cache_tokens is not None:
            num_blocks = self.kv_cache_tokens // self.block_size
        else:
            num_blocks = self.kv_budget().num_blocks
        fitted = self.timing == "fitted"
        return EngineParams(
            model=self.model,
            max_num_seqs=batch.max_num_seqs,
            max_num_batched_tokens=batch.max_num_batched_tokens,
            block_size=self.block_size,
            num_blocks=max(8, num_blocks),
            # the linear timing has its own overhead and, unless ``jitter`` is set, no jitter
            # (as the emulator it mirrors); the step noise applies to both timings
            step_overhead_s=self.step_overhead_ms / 1e3 if fitted else 0.0,
            step_overhead_per_seq_s=self.step_overhead_per_seq_us / 1e6 if fitted else 0.0,
            step_overhead_per_token_s=self.step_overhead_per_token_us / 1e6 if fitted else 0.0,
            jitter=self.jitter if fitted or "jitter" in self.model_fields_set else 0.0,
            straggler_rate=self.straggler_rate,
            straggler_factor=self.straggler_factor,
            stream_interval=self.stream_interval,
            kv_lease_s=self.kv_lease_s,
            kv_load_failure_policy=self.kv_load_failure_policy,
            prefix_caching=self.prefix_caching,
            async_scheduling=self.async_scheduling,
        )


class SimSettings(_Strict):
    """``[sim]``: the run itself and how it is judged."""

    seed: int = 0
    slo_ttft_s: float = Field(2.0, gt=0)  # DistServe: time to first token seen by the client
    slo_tpot_s: float = Field(0.1, gt=0)  # DistServe: mean time per output token
    sample_interval_s: float = Field(1.0, gt=0)  # state timeline sampling
    decision_log: bool = True
    health_checks: bool = True
    tick_s: float | None = Field(None, gt=0)  # maintenance loop tick (None: the core's default)
    max_sim_s: float = Field(86_400.0, gt=0)  # safety stop
    # hand a stream's plain token chunks to the router in bursts stamped with their arrival
    # times (identical results, far fewer router wake-ups); false: one wake-up per chunk
    coalesce_reads: bool = True
    # KV cache events (a kv_aware phase only): each engine's events reach the router's index
    # this long after they happen (vLLM: one batch per engine step, then the ZMQ hop)
    kv_event_delay_s: float = Field(0.005, ge=0)


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    router: NarwhalConfig
    fleet: FleetSettings
    workload: WorkloadSettings
    faults: tuple[FaultSpec, ...] = ()
    sim: SimSettings = SimSettings()
    replicas: RouterReplicaSettings = RouterReplicaSettings()  # [router]

    def with_seed(self, seed: int | None) -> Scenario:
        if seed is None:
            return self
        return self.model_copy(update={"sim": self.sim.model_copy(update={"seed": seed})})


def _format(error: ValidationError, source: str, prefix: str, model: type[BaseModel]) -> list[str]:
    return validation_problems(
        error,
        prefix=prefix,
        unknown_key="unknown key (check the spelling against docs/simulator.md)",
        model=model,
    )


def _fleet_engines(fleet: FleetSettings) -> list[dict[str, str]]:
    engines = [{"url": f"http://sim-p{i}", "role": "prefill"} for i in range(fleet.prefill)]
    engines += [{"url": f"http://sim-d{i}", "role": "decode"} for i in range(fleet.decode)]
    engines += [{"url": f"http://sim-b{i}", "role": "both"} for i in range(fleet.both)]
    return engines


def parse_scenario(
    data: dict[str, Any], source: str = "<scenario>", profile: dict[str, Any] | None = None
) -> Scenario:
    """Validate a mapping (as read from TOML) into a :class:`Scenario` (``profile``: a
    per-operator profile already read, for ``[fleet]`` instead of its ``profile`` file or the
    bundled one)."""
    problems: list[str] = []
    known = {*ROUTER_KEYS, "name", "description", "fleet", "workload", "faults", "sim", "router"}
    for key in sorted(set(data) - known):
        problems.append(
            f"  {key}: unknown key (check the spelling against docs/simulator.md); "
            f"valid keys: {', '.join(sorted(known))}"
        )
    parts: dict[str, Any] = {}
    models: dict[str, type[BaseModel]] = {
        "fleet": FleetSettings,
        "workload": WorkloadSettings,
        "sim": SimSettings,
        "router": RouterReplicaSettings,
    }
    for key, model in models.items():
        try:
            context = {"profile": profile} if key == "fleet" and profile is not None else None
            parts[key] = model.model_validate(data.get(key, {}), context=context)
        except ValidationError as error:
            problems.extend(_format(error, source, key, model))
    faults: list[FaultSpec] = []
    raw_faults = data.get("faults", [])
    if not isinstance(raw_faults, list):
        problems.append("  faults: must be an array of tables ([[faults]])")
        raw_faults = []
    for i, raw in enumerate(raw_faults):
        try:
            faults.append(FaultSpec.model_validate(raw))
        except ValidationError as error:
            problems.extend(_format(error, source, f"faults[{i}]", FaultSpec))
    router_data = {k: data[k] for k in ROUTER_KEYS if k in data}
    if "engines" not in router_data and "fleet" in parts:
        router_data["engines"] = _fleet_engines(parts["fleet"])
        if not router_data["engines"]:
            problems.append("  fleet: no engines (set prefill/decode/both, or list [[engines]])")
    elif "engines" in router_data and "fleet" in parts:
        fleet = parts["fleet"]
        if fleet.prefill or fleet.decode or fleet.both:
            problems.append("  fleet: give engine counts or [[engines]], not both")
    if "engines" not in router_data:  # [fleet] was refused: still check the router's keys
        router_data["engines"] = _fleet_engines(FleetSettings(prefill=1, decode=1))
    router: NarwhalConfig | None = None
    try:
        router = parse_config(router_data, source)
    except ConfigError as error:
        problems.extend(str(error).splitlines()[1:])
    if router is not None:
        roles = {e.url: e.role.value for e in router.engines}
        for i, spec in enumerate(faults):
            try:
                targets(spec, roles)
            except ValueError as error:
                problems.append(f"  faults[{i}]: {error}")
    workload = parts.get("workload")
    if isinstance(workload, WorkloadSettings) and workload.duration_s is not None:
        for i, spec in enumerate(faults):
            if spec.at_s is not None and spec.at_s >= workload.duration_s:
                problems.append(
                    f"  faults[{i}].at_s: {spec.at_s:g} s is not before the workload's end "
                    f"(workload.duration_s = {workload.duration_s:g} s): the fault could not "
                    "take effect in the run"
                )
    if problems or router is None:
        raise ScenarioError("\n".join([f"invalid scenario in {source}:", *problems]))
    return Scenario(
        name=str(data.get("name", Path(source).stem)),
        description=str(data.get("description", "")),
        router=router,
        fleet=parts["fleet"],
        workload=parts["workload"],
        faults=tuple(faults),
        sim=parts["sim"],
        replicas=parts["router"],
    )


def default_scenario_text() -> str:
    return resources.files("narwhal.sim").joinpath("scenarios", DEFAULT_SCENARIO).read_text("utf-8")


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Read a scenario file; ``None`` reads the embedded default."""
    if path is None:
        source = "default.toml (embedded)"
        data = parse_toml(default_scenario_text(), source, ScenarioError)
    else:
        source = str(path)
        data = read_toml(path, "scenario", ScenarioError)
    scenario = parse_scenario(data, source)
    if path is None:
        scenario = scenario.model_copy(update={"name": str(data.get("name", "default"))})
    return scenario
