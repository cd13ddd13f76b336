"""Which reader an LLMServingSim profile directory needs: today's layout or the older one.

Rule kept here: the directory's files decide. ``meta.yaml`` is today's layout
(:mod:`.source`); ``tp<N>/layers.csv`` is the older per-layer one (:mod:`.source_v0`); anything
else is refused naming both.
"""

from __future__ import annotations

from pathlib import Path

from narwhal.sim.profiles.source import ProfileError, SourceProfile, read_profile
from narwhal.sim.profiles.source_v0 import is_v0, read_v0_profile


def read_any(profile_dir: Path, model_config: Path | None = None) -> SourceProfile:
    if (profile_dir / "meta.yaml").is_file():
        return read_profile(profile_dir, model_config)
    if is_v0(profile_dir):
        return read_v0_profile(profile_dir, model_config)
    raise ProfileError(
        f"{profile_dir}: neither a profile directory (no meta.yaml, as profiler/perf/<GPU>/<org>/"
        "<model>/<dtype>/ has) nor an older per-layer one (no tp<N>/layers.csv, as "
        "perf_models/<GPU>/<org>/<model>/ has)"
    )


def origin(profile_dir: Path) -> str:
    """Where a profile came from, as written into it: its path inside the LLMServingSim
    checkout when it sits in one (from ``profiler/perf``, ``profiler/v0`` or ``llm_profile``:
    no local directories), else as given."""
    parts = profile_dir.resolve().parts
    for anchor in (("profiler", "perf"), ("profiler", "v0"), ("llm_profile", "perf_models")):
        for i in range(len(parts) - 1):
            if parts[i : i + 2] == anchor:
                return "LLMServingSim " + "/".join(parts[i:])
    return str(profile_dir)
