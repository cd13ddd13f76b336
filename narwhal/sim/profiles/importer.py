"""Which reader a profile directory needs: LLMServingSim's layout, its older one, or Vidur's.

Rule kept here: the directory's files decide. ``meta.yaml`` is LLMServingSim's layout
(:mod:`.source`); ``tp<N>/layers.csv`` its older per-layer one (:mod:`.source_v0`); ``mlp.csv``
or ``attention.csv`` Vidur's compute profile (:mod:`.source_vidur`); anything else is refused
naming all three.
"""

from __future__ import annotations

from pathlib import Path

from narwhal.sim.profiles.source import ProfileError, SourceProfile, read_profile
from narwhal.sim.profiles.source_v0 import is_v0, read_v0_profile
from narwhal.sim.profiles.source_vidur import is_vidur, read_vidur_profile


def read_any(profile_dir: Path, model_config: Path | None = None) -> SourceProfile:
    if (profile_dir / "meta.yaml").is_file():
        return read_profile(profile_dir, model_config)
    if is_v0(profile_dir):
        return read_v0_profile(profile_dir, model_config)
    if is_vidur(profile_dir):
        return read_vidur_profile(profile_dir, model_config)
    raise ProfileError(
        f"{profile_dir}: neither a profile directory (no meta.yaml, as profiler/perf/<GPU>/<org>/"
        "<model>/<dtype>/ has), nor an older per-layer one (no tp<N>/layers.csv, as "
        "perf_models/<GPU>/<org>/<model>/ has), nor Vidur's (no mlp.csv, as "
        "data/profiling/compute/<gpu>/<org>/<model>/ has)"
    )


ANCHORS = (
    ("LLMServingSim", ("profiler", "perf")),
    ("LLMServingSim", ("profiler", "v0")),
    ("LLMServingSim", ("llm_profile", "perf_models")),
    ("Vidur", ("data", "profiling", "compute")),
)


def origin(profile_dir: Path) -> str:
    """Where a profile came from, as written into it: the project and its path inside that
    project's checkout when it sits in one (LLMServingSim's ``profiler/perf``, ``profiler/v0``
    or ``llm_profile``; Vidur's ``data/profiling/compute``: no local directories), else as
    given."""
    parts = profile_dir.resolve().parts
    for project, anchor in ANCHORS:
        for i in range(len(parts) - len(anchor) + 1):
            if parts[i : i + len(anchor)] == anchor:
                return f"{project} " + "/".join(parts[i:])
    return str(profile_dir)
