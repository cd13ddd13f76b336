"""A real vLLM run as LLMServingSim records it: per-request timestamps and the engine's settings.

Rule kept here: the run is read as recorded and measured as its recorder measures it
(LLMServingSim's ``bench/core/validate.py``): time to first token and end-to-end latency from
``queued_ts`` (when the engine queued the request), time per output token over the tokens after
the first. The engine's settings come from the run's ``meta.json``; a setting the file does not
record is vLLM's default for that version, named as such in :attr:`EngineSetup.defaulted`. A
run directory lacking a file or a field the replay needs is refused with its name.

Theory of operation: ``RUN_DIR`` is ``bench/examples/<GPU>/<model>/`` (its ``vllm/`` holds
``meta.json`` and ``requests.jsonl``) or that ``vllm/`` directory itself; ``config.json`` beside
``vllm/``, where present, gives the cluster (instances, prefill/decode roles). The prompts'
token ids, where the run's dataset can be found (``meta.json``'s ``dataset_path``, as
``dataset.jsonl`` or ``dataset.jsonl.xz`` in the run directory or under the LLMServingSim
checkout the run sits in, checked against ``dataset_hash``), give each prompt's content
identity block by block (:func:`prompt_segments`), so the simulated prefix cache hits where
vLLM's did; without it every prompt is unique (no prefix hits), and the replay says so.

A run published only as mean figures (a paper's artifact) has ``means.json`` in place of
``requests.jsonl``: ``{"source": where the figures are published, "num_requests": N, "real":
{metric: mean}, "anchors": {simulator: {metric: mean}}}`` with metrics ``ttft_ms``, ``tpot_ms``,
``latency_ms`` and ``throughput_tok_s`` (output tokens per second of the whole run), and
optionally ``"real_range": {metric: [low, high]}`` for a figure the source only brackets (read
off a binned series: the mean is the bracket's best estimate, inside it); its requests
(arrivals, lengths, prompts) are its dataset's rows, which it must have, and their times are not
recorded (``ttft_s`` None), so it is compared on means alone. A batch limit the run does not
record (``max_num_seqs``, ``max_num_batched_tokens``) is vLLM's default for its GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import lzma
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from narwhal.sim.profiles.gpus import GPUS
from narwhal.sim.profiles.source import ProfileError
from narwhal.sim.vllm_defaults import async_scheduling_default, batch_defaults

MEANS = "means.json"  # a run published as mean figures only, in place of requests.jsonl
REQUEST_FIELDS = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")


def time_per_output_token(
    ttft_s: float | None, latency_s: float | None, output: int
) -> float | None:
    """Time per output token after the first (None for a one-token answer, or a request whose
    times the run did not record), as the run's recorder measures it."""
    if output <= 1 or ttft_s is None or latency_s is None:
        return None
    return (latency_s - ttft_s) / (output - 1)


@dataclass(frozen=True)
class RunRequest:
    """One request of the run, in the file's order (the dataset's row order)."""

    arrival_s: float  # queued_ts, from the run's first
    prompt: int
    output: int
    ttft_s: float | None  # None: a means-only run (see RunMeans)
    latency_s: float | None
    segments: tuple[tuple[int, int], ...] = ()  # prompt content identity, where the run has it

    @property
    def tpot_s(self) -> float | None:
        return time_per_output_token(self.ttft_s, self.latency_s, self.output)


@dataclass(frozen=True)
class EngineSetup:
    """What one engine of the run ran with."""

    model: str
    vllm_version: str
    gpu_name: str | None
    gpu_memory_bytes: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_gpu_blocks: int | None
    gpu_memory_utilization: float
    prefix_caching: bool
    tensor_parallel: int
    enforce_eager: bool
    capture_sizes: tuple[int, ...] | None  # None: vLLM's default rule
    async_scheduling: bool
    defaulted: tuple[str, ...] = field(default=())  # settings the run did not record


@dataclass(frozen=True)
class Cluster:
    """How the run's engines were laid out (LLMServingSim's cluster ``config.json``)."""

    prefill: int = 0  # engines that only prefill (a disaggregated run)
    decode: int = 0  # engines that only decode
    colocated: int = 1  # engines that do both
    link_gbps: float | None = None  # the KV link between engines, GB/s
    link_latency_s: float | None = None

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0 or self.decode > 0


MEAN_METRICS = ("ttft_ms", "tpot_ms", "latency_ms", "throughput_tok_s")


@dataclass(frozen=True)
class RunMeans:
    """A run published as mean figures only (``means.json``): what was measured, where it was
    published, and other simulators' figures for the same run (anchors)."""

    source: str
    real: dict[str, float]  # of MEAN_METRICS
    anchors: dict[str, dict[str, float]]  # simulator -> its figures (of MEAN_METRICS)
    # metric -> (low, high): where the source only brackets the real figure
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunLog:
    path: Path
    gpu: str  # the run's hardware key (its directory name)
    engine: EngineSetup
    cluster: Cluster
    requests: tuple[RunRequest, ...]
    dataset: Path | None = None  # where the prompts' token ids came from
    means: RunMeans | None = None  # a means-only run: its requests' times are not recorded
    # the dataset meta.json names (dataset_path) and the places looked for it, when it was not
    # found there: the prompts are then replayed as unique content (no prefix-cache hit)
    dataset_missing: tuple[str, tuple[Path, ...]] | None = None


def _vllm_dir(run_dir: Path) -> Path:
    for candidate in (run_dir / "vllm", run_dir):
        if (candidate / "requests.jsonl").is_file() or (candidate / MEANS).is_file():
            return candidate
    raise ProfileError(
        f"{run_dir}: no requests.jsonl nor {MEANS} (in vllm/ or the directory itself)"
    )


def _figures(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, dict) or not value:
        raise ProfileError(f"{where}: not an object of figures")
    unknown = sorted(set(value) - set(MEAN_METRICS))
    if unknown:
        raise ProfileError(
            f"{where}: unknown {', '.join(unknown)} (known: {', '.join(MEAN_METRICS)})"
        )
    bad = [k for k, v in value.items() if not isinstance(v, int | float) or v <= 0]
    if bad:
        raise ProfileError(f"{where}: {', '.join(bad)} not a positive number")
    return {k: float(v) for k, v in value.items()}


def _ranges(value: Any, real: dict[str, float], where: str) -> dict[str, tuple[float, float]]:
    """``real_range``: per metric of ``real``, ``[low, high]`` with low <= the figure <= high."""
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: not an object of [low, high] pairs")
    out: dict[str, tuple[float, float]] = {}
    for metric, pair in value.items():
        if metric not in real:
            raise ProfileError(f"{where}: {metric} is not one of real's figures")
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(v, int | float) and v > 0 for v in pair)
            or not pair[0] <= real[metric] <= pair[1]
        ):
            raise ProfileError(
                f"{where}: {metric} is not [low, high] of positive numbers around "
                f"real's {real[metric]:g}"
            )
        out[str(metric)] = (float(pair[0]), float(pair[1]))
    return out


def read_means(path: Path) -> tuple[RunMeans, int]:
    """A means-only run's figures and its request count (see the module docstring)."""
    try:
        raw = json.loads(path.read_text("utf-8"))
    except ValueError as error:
        raise ProfileError(f"{path}: {error}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: not a JSON object")
    missing = [k for k in ("source", "num_requests", "real") if k not in raw]
    if missing:
        raise ProfileError(f"{path}: no {', '.join(missing)}")
    if not isinstance(raw["num_requests"], int) or raw["num_requests"] < 2:
        raise ProfileError(f"{path}: num_requests is not a count of at least 2")
    anchors = raw.get("anchors") or {}
    if not isinstance(anchors, dict):
        raise ProfileError(f"{path}: anchors is not an object")
    unknown = sorted(set(raw) - {"source", "num_requests", "real", "real_range", "anchors"})
    if unknown:
        raise ProfileError(f"{path}: unknown {', '.join(unknown)}")
    real = _figures(raw["real"], f"{path}: real")
    means = RunMeans(
        source=str(raw["source"]),
        real=real,
        anchors={str(k): _figures(v, f"{path}: anchors.{k}") for k, v in anchors.items()},
        ranges=_ranges(raw.get("real_range", {}), real, f"{path}: real_range"),
    )
    return means, int(raw["num_requests"])


def _numeric_rows(
    where: Path, lines: Iterable[str | bytes], fields: tuple[str, ...]
) -> list[dict[str, Any]]:
    """The JSON lines' rows, each with a number in every one of ``fields``; blank lines skipped,
    anything else refused naming its line."""
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ProfileError(f"{where}:{number}: {error}") from None
        missing = [k for k in fields if not isinstance(row.get(k), int | float)]
        if missing:
            raise ProfileError(f"{where}:{number}: no {', '.join(missing)}")
        rows.append(row)
    if not rows:
        raise ProfileError(f"{where}: no requests")
    return rows


def dataset_requests(dataset: Path, text: bytes) -> tuple[RunRequest, ...]:
    """A means-only run's requests from its dataset (LLMServingSim's format: ``arrival_time_ns``,
    ``input_toks``, ``output_toks`` a row), arrivals from the first; times not recorded."""
    fields = ("arrival_time_ns", "input_toks", "output_toks")
    rows = _numeric_rows(dataset, text.splitlines(), fields)
    start = min(float(r["arrival_time_ns"]) for r in rows)
    return tuple(
        RunRequest(
            arrival_s=(float(r["arrival_time_ns"]) - start) / 1e9,
            prompt=int(r["input_toks"]),
            output=int(r["output_toks"]),
            ttft_s=None,
            latency_s=None,
        )
        for r in rows
    )


def read_requests(path: Path) -> tuple[RunRequest, ...]:
    with path.open(encoding="utf-8") as handle:
        raw = _numeric_rows(path, handle, REQUEST_FIELDS)
    start = min(float(r["queued_ts"]) for r in raw)
    return tuple(
        RunRequest(
            arrival_s=float(r["queued_ts"]) - start,
            prompt=int(r["input_toks"]),
            output=int(r["output_toks"]),
            ttft_s=float(r["first_token_ts"]) - float(r["queued_ts"]),
            latency_s=float(r["last_token_ts"]) - float(r["queued_ts"]),
        )
        for r in raw
    )


def _batch_limits(
    kwargs: dict[str, Any], gpu: str, hardware: dict[str, Any], where: Path
) -> tuple[int, int, list[str]]:
    """The run's sequence cap and token budget: as recorded, else vLLM's defaults for the GPU
    (``vllm serve`` on that device: :func:`~narwhal.sim.vllm_defaults.batch_defaults`), the
    catalogue's or, for a GPU outside it, the device ``meta.json``'s ``hardware`` records."""
    seqs, tokens = kwargs.get("max_num_seqs"), kwargs.get("max_num_batched_tokens")
    absent = [
        k for k, v in (("max_num_seqs", seqs), ("max_num_batched_tokens", tokens)) if v is None
    ]
    if not absent:
        if not isinstance(seqs, int) or not isinstance(tokens, int):
            raise ProfileError(f"{where}: max_num_seqs and max_num_batched_tokens must be integers")
        return seqs, tokens, []
    name, memory = hardware.get("device_name"), hardware.get("device_total_memory_bytes")
    if gpu in GPUS:
        name, memory = GPUS[gpu].name, GPUS[gpu].memory_bytes
    elif not isinstance(name, str) or not isinstance(memory, int):
        raise ProfileError(
            f"{where}: engine_kwargs has no {', '.join(absent)}, GPU {gpu!r} is not one of "
            f"{', '.join(sorted(GPUS))} whose vLLM defaults are known, and hardware records "
            "no device_name and device_total_memory_bytes to take them from"
        )
    vllm = batch_defaults(
        memory,
        name,
        max_num_seqs=seqs if isinstance(seqs, int) else None,
        max_num_batched_tokens=tokens if isinstance(tokens, int) else None,
    )
    return vllm.max_num_seqs, vllm.max_num_batched_tokens, absent


def _async_scheduling(
    meta: dict[str, Any], kwargs: dict[str, Any], scheduler: dict[str, Any], defaulted: list[str]
) -> bool:
    """As recorded (the resolved scheduler config, else the engine's arguments), else vLLM's
    default for the run's version; a run that records neither is taken as synchronous (the
    older behaviour: nothing says the engine planned ahead)."""
    for recorded in (scheduler.get("async_scheduling"), kwargs.get("async_scheduling")):
        if isinstance(recorded, bool):
            return recorded
    defaulted.append("async_scheduling")
    default = async_scheduling_default(
        str(meta.get("vllm_version", "")), int(kwargs.get("pipeline_parallel_size") or 1)
    )
    return bool(default)


def _engine(meta: dict[str, Any], where: Path, gpu: str) -> EngineSetup:
    kwargs = meta.get("engine_kwargs")
    if not isinstance(kwargs, dict):
        raise ProfileError(f"{where}: no engine_kwargs")
    hardware = meta.get("hardware") or {}
    limits = _batch_limits(kwargs, gpu, hardware, where)
    max_num_seqs, max_num_batched_tokens, batch_defaulted = limits
    resolved = meta.get("resolved_config") or {}
    cache = meta.get("kv_cache") or {}
    compilation = resolved.get("compilation_config") or {}
    scheduler = resolved.get("scheduler_config") or {}
    model_config = resolved.get("model_config") or {}
    defaulted: list[str] = list(batch_defaulted)

    def pick(value: Any, default: Any, name: str) -> Any:
        if value is None:
            defaulted.append(name)
            return default
        return value

    sizes = compilation.get("cudagraph_capture_sizes")
    return EngineSetup(
        model=str(meta.get("model", kwargs.get("model", ""))),
        vllm_version=str(meta.get("vllm_version", "")),
        gpu_name=hardware.get("device_name"),
        gpu_memory_bytes=hardware.get("device_total_memory_bytes"),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=int(pick(cache.get("block_size"), 16, "block_size")),
        num_gpu_blocks=cache.get("num_gpu_blocks"),
        gpu_memory_utilization=float(
            pick(cache.get("gpu_memory_utilization"), 0.9, "gpu_memory_utilization")
        ),
        prefix_caching=bool(pick(cache.get("enable_prefix_caching"), True, "prefix_caching")),
        tensor_parallel=int(kwargs.get("tensor_parallel_size") or 1),
        enforce_eager=bool(pick(model_config.get("enforce_eager"), False, "enforce_eager")),
        capture_sizes=tuple(int(s) for s in sizes) if sizes else None,
        async_scheduling=_async_scheduling(meta, kwargs, scheduler, defaulted),
        defaulted=tuple(defaulted),
    )


def read_run(run_dir: Path) -> RunLog:
    """Read a run directory (see the module docstring)."""
    vllm_dir = _vllm_dir(run_dir)
    meta_path = vllm_dir / "meta.json"
    if not meta_path.is_file():
        raise ProfileError(f"{meta_path}: missing")
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except ValueError as error:
        raise ProfileError(f"{meta_path}: {error}") from None
    gpu = vllm_dir.parent.parent.name if vllm_dir.name == "vllm" else vllm_dir.parent.name
    engine = _engine(meta, meta_path, gpu)
    cluster = _cluster(vllm_dir.parent / "config.json") or Cluster()
    data_parallel = int((meta.get("engine_kwargs") or {}).get("data_parallel_size") or 1)
    if not cluster.disaggregated and data_parallel > cluster.colocated:
        cluster = dataclasses.replace(cluster, colocated=data_parallel)
    found = find_dataset(vllm_dir, meta)
    means = None
    if (vllm_dir / "requests.jsonl").is_file():
        requests = read_requests(vllm_dir / "requests.jsonl")
    else:
        means, count = read_means(vllm_dir / MEANS)
        if found is None:
            raise ProfileError(
                f"{vllm_dir / MEANS}: a means-only run replays its dataset: meta.json needs "
                "dataset_path and dataset_hash, the file as dataset.jsonl or dataset.jsonl.xz "
                f"in {vllm_dir.parent if vllm_dir.name == 'vllm' else vllm_dir}"
            )
        requests = dataset_requests(*found)
        if len(requests) != count:
            raise ProfileError(
                f"{vllm_dir / MEANS}: num_requests {count}, the dataset has {len(requests)}"
            )
    dataset, missing = None, None
    if found is not None:
        dataset, text = found
        requests = with_segments(requests, dataset, text, engine.block_size)
    elif places := dataset_places(vllm_dir, meta):
        missing = (str(meta["dataset_path"]), places)
    return RunLog(
        path=run_dir,
        gpu=gpu,
        engine=engine,
        cluster=cluster,
        requests=requests,
        dataset=dataset,
        means=means,
        dataset_missing=missing,
    )


def dataset_places(vllm_dir: Path, meta: dict[str, Any]) -> tuple[Path, ...]:
    """Where a run's dataset may be (empty when meta.json names none, or no hash to check it
    by): ``dataset.jsonl`` or ``dataset.jsonl.xz`` in the run directory, or ``dataset_path``
    under the LLMServingSim checkout holding ``bench/examples/<GPU>/<model>/``."""
    name = meta.get("dataset_path")
    digest = meta.get("dataset_hash")
    if not isinstance(name, str) or not isinstance(digest, str):
        return ()
    run_dir = vllm_dir.parent if vllm_dir.name == "vllm" else vllm_dir
    candidates = [run_dir / "dataset.jsonl", run_dir / "dataset.jsonl.xz"]
    if len(run_dir.resolve().parents) > 2:
        candidates.append(run_dir.resolve().parents[2] / name)
    return tuple(candidates)


def find_dataset(vllm_dir: Path, meta: dict[str, Any]) -> tuple[Path, bytes] | None:
    """The run's dataset file and its (decompressed) bytes, if it is where a run keeps it and
    its hash is the recorded one."""
    digest = meta.get("dataset_hash")
    for path in dataset_places(vllm_dir, meta):
        if path.is_file():
            data = path.read_bytes()
            text = lzma.decompress(data) if path.suffix == ".xz" else data
            if hashlib.sha256(text).hexdigest() != digest:
                raise ProfileError(f"{path}: its sha256 is not meta.json's dataset_hash")
            return path, text
    return None


def prompt_segments(
    token_ids: list[list[int]], block_size: int
) -> list[tuple[tuple[int, int], ...]]:
    """Each prompt's content identity: one segment per full block, numbered so that a segment
    id names the block and everything before it (the chain vLLM's block hashes form), and a
    last segment unique to the prompt for its partial block."""
    chain: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    for ids in token_ids:
        segments: list[tuple[int, int]] = []
        parent = -1
        full = len(ids) // block_size * block_size
        for start in range(0, full, block_size):
            key = (parent, tuple(ids[start : start + block_size]))
            parent = chain.setdefault(key, len(chain))
            segments.append((parent, block_size))
        if len(ids) > full:
            segments.append((-1, len(ids) - full))  # renumbered below: unique to this prompt
        out.append(segments)
    fresh = len(chain)
    result = []
    for segments in out:
        renumbered = []
        for segment_id, length in segments:
            if segment_id < 0:
                segment_id, fresh = fresh, fresh + 1
            renumbered.append((segment_id, length))
        result.append(tuple(renumbered))
    return result


def with_segments(
    requests: tuple[RunRequest, ...], dataset: Path, text: bytes, block_size: int
) -> tuple[RunRequest, ...]:
    """``requests`` with the segments of the prompts in ``text``, the dataset's bytes (row
    ``i`` is request ``i`` in the run's file order; a row whose length disagrees with the
    request's is refused)."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    if len(rows) != len(requests):
        raise ProfileError(f"{dataset}: {len(rows)} prompts for {len(requests)} requests")
    ids = []
    for number, (row, request) in enumerate(zip(rows, requests, strict=True), 1):
        tokens = row.get("input_tok_ids")
        if not isinstance(tokens, list) or len(tokens) != request.prompt:
            raise ProfileError(f"{dataset}:{number}: input_tok_ids do not match input_toks")
        ids.append(tokens)
    return tuple(
        dataclasses.replace(request, segments=segments)
        for request, segments in zip(requests, prompt_segments(ids, block_size), strict=True)
    )


def _cluster(path: Path) -> Cluster | None:
    """The engines' layout from LLMServingSim's cluster config (``pd_type`` prefill / decode /
    none per instance; ``link_bw`` GB/s and ``link_latency`` ns between them)."""
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text("utf-8"))
    except ValueError as error:
        raise ProfileError(f"{path}: {error}") from None
    instances = [i for node in config.get("nodes", []) for i in node.get("instances", [])]
    if not instances:
        return None
    roles = [str(i.get("pd_type") or "") for i in instances]
    unknown = sorted({r for r in roles if r not in ("", "prefill", "decode")})
    if unknown:
        raise ProfileError(f"{path}: unknown pd_type {', '.join(unknown)}")
    link = config.get("link_bw")
    latency = config.get("link_latency")
    return Cluster(
        prefill=roles.count("prefill"),
        decode=roles.count("decode"),
        colocated=roles.count(""),
        link_gbps=float(link) if isinstance(link, int | float) and link > 0 else None,
        link_latency_s=float(latency) / 1e9 if isinstance(latency, int | float) else None,
    )
