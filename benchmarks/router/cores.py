"""Which cores a benchmark's processes run on: the router under test on a core of its own, and
everything else (the engines, the load generator, the script) on the others.

Why: the figures compare routers' CPU and their latency. Left to the scheduler, a router shares
its core with the emulated engines and the load generator, so a router that spends more CPU also
slows the engines it is measured against (on 2 cores, every router millisecond is one the
engines lose), and the time to first token under load measures that coupling as much as the
router. Pinned, the router has one core, as a router deployed beside its engines would, and the
fleet's speed is the same for every router. ``--no-pin`` turns it off; with a single core there
is nothing to split.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_SPLIT: dict[str, set[int]] = {}


def pin(enabled: bool = True) -> str:
    """Move this process (and so every child it starts from now on) off the router's core;
    returns a line saying what was done."""
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2:
        return f"cores: not pinned ({len(cores)} available)"
    _SPLIT["router"], _SPLIT["rest"] = {cores[-1]}, set(cores[:-1])
    os.sched_setaffinity(0, _SPLIT["rest"])
    return f"cores: routers on {cores[-1]}, engines and load generator on {cores[:-1]}"


def router_preexec() -> Callable[[], None] | None:
    """What a router's child process runs before it starts: its own core (None if unpinned)."""
    if "router" not in _SPLIT:
        return None
    router = _SPLIT["router"]
    return lambda: os.sched_setaffinity(0, router)
