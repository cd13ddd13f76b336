"""``narwhal validate``: a real run replayed on the simulated engine, and how far apart they are.

Rule kept here: the profile is the one given (an LLMServingSim profile directory, or a Narwhal
profile file), else the bundled profile of the run's GPU and model; the run is replayed once
(:mod:`.replay`, deterministic) and compared per metric (:mod:`.compare`): as distributions, or
on means where the run published only means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from narwhal.sim.profiles import importer, source, store
from narwhal.sim.validation.compare import compare, compare_means, sim_throughput
from narwhal.sim.validation.replay import Timed, replay
from narwhal.sim.validation.runlog import RunLog, read_run


def load_profile(path: Path | None, run: RunLog) -> dict[str, Any]:
    """The profile at ``path`` (directory: LLMServingSim's layout; file: Narwhal's), else the
    bundled one for the run's GPU and model."""
    if path is None:
        return store.bundled(run.gpu, run.engine.model)
    if path.is_dir():
        return store.from_source(importer.read_any(path), importer.origin(path))
    if path.is_file():
        return store.read(path)
    raise source.ProfileError(f"{path}: no such profile directory or file")


Samples = dict[str, tuple[list[float], list[float]]]  # metric -> (real, simulated), seconds


@dataclass(frozen=True)
class Validation:
    run: RunLog
    profile: dict[str, Any]
    result: dict[str, Any]  # validation.json
    # metric -> (real, sim) in seconds; empty for a means-only run (no real distribution)
    samples: Samples
    # a means-only run: the simulated means of what it did not publish (printed, for the record)
    unpublished: dict[str, float] = field(default_factory=dict)


def paired_samples(run: RunLog, timed: list[Timed]) -> Samples:
    """Per metric, the run's measured values (those it recorded) and the replay's."""
    real = run.requests
    return {
        "ttft_ms": (
            [r.ttft_s for r in real if r.ttft_s is not None],
            [t.ttft_s for t in timed],
        ),
        "tpot_ms": (
            [r.tpot_s for r in real if r.tpot_s is not None],
            [t.tpot_s for t in timed if t.tpot_s is not None],
        ),
        "latency_ms": (
            [r.latency_s for r in real if r.latency_s is not None],
            [t.latency_s for t in timed],
        ),
    }


def simulated_means(run: RunLog, timed: list[Timed], samples: Samples) -> dict[str, float]:
    """The replay's figure for each metric a means-only run may publish (ms, and tok/s)."""
    sim = {metric: 1e3 * mean(values) for metric, (_, values) in samples.items()}
    sim["throughput_tok_s"] = sim_throughput(
        [r.arrival_s for r in run.requests],
        [t.latency_s for t in timed],
        [t.output for t in timed],
    )
    return sim


def validate(run_dir: Path, profile_path: Path | None = None, seed: int = 0) -> Validation:
    run = read_run(run_dir)
    profile = load_profile(profile_path, run)
    if profile["model"] != run.engine.model:
        raise source.ProfileError(
            f"the profile is of {profile['model']}, the run served {run.engine.model}"
        )
    timed = replay(run, profile, seed)
    samples = paired_samples(run, timed)
    if run.means is not None:
        sim = simulated_means(run, timed, samples)
        result = compare_means(run.means.real, sim, run.means.anchors, run.means.ranges)
        unpublished = {k: v for k, v in sim.items() if k not in run.means.real}
        return Validation(run, profile, result, {}, unpublished)
    result = {metric: compare(a, b) for metric, (a, b) in samples.items()}
    return Validation(run, profile, result, samples)
