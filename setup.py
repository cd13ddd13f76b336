"""The optional compiled build: ``NARWHAL_COMPILE=1`` compiles the hot paths with mypyc.

Why: a capacity-planning sweep runs the simulator millions of times per request-second it
plans, and a router's CPU per request and per streamed chunk is what bounds a core's streams.
So the modules a simulated request and a served request pass through (the core's request path,
the simulated engine and its driver, the live HTTP server, engine client and transport) are
compiled to C from the same typed sources: about 2.2 times fewer instructions per simulated
request (``benchmarks/simulator/sim_instructions.py``) and about two thirds of the
user-space instructions per served request and per streamed chunk
(``benchmarks/router/router_instructions.py``); docs/simulator.md (Speed) and
docs/benchmarks.md have the figures. Nothing changes in what they do: CI runs the default
test suite against the compiled build and checks that ``narwhal simulate`` writes
byte-identical results with it. A plain ``pip install`` (editable or not)
stays pure Python, so an edited source is always the code that runs; the container image
(``deploy/Containerfile``) installs the compiled wheel.

    bash scripts/build_wheel.sh dist     # the compiled wheel: NARWHAL_COMPILE=1 pip wheel ...
    bash scripts/build_compiled.sh       # .venv-compiled: the dev dependencies and that wheel

(``build_wheel.sh`` installs the build tools, mypy among them, in a venv of its own and runs
``NARWHAL_COMPILE=1 pip wheel --no-build-isolation``.) Metadata lives in ``pyproject.toml``.
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import setup

# The modules a simulated or a served request passes through. Not here: modules defining
# pydantic models (mypyc cannot compile their metaclass), ones with async generators
# (narwhal/live/app.py's lifespan), subclasses of OSError (narwhal/live/h1errors.py),
# narwhal/live/inference.py (compiled, a served request took 2 % more instructions,
# benchmarks/router/router_instructions.py) and everything off the hot path.
COMPILED = [
    "narwhal/core/breaker.py",
    "narwhal/core/client_writes.py",
    "narwhal/core/descriptor.py",
    "narwhal/core/empty_streams.py",
    "narwhal/core/entry.py",
    "narwhal/core/errors.py",
    "narwhal/core/jsoncopy.py",
    "narwhal/core/jsonparse.py",
    "narwhal/core/legs.py",
    "narwhal/core/lifecycle.py",
    "narwhal/core/placement.py",
    "narwhal/core/policies.py",
    "narwhal/core/ports.py",
    "narwhal/core/records.py",
    "narwhal/core/requests.py",
    "narwhal/core/resume.py",
    "narwhal/core/retry.py",
    "narwhal/core/routing/build.py",
    "narwhal/core/routing/kv_aware.py",
    "narwhal/core/routing/load.py",
    "narwhal/core/routing/policy.py",
    "narwhal/core/routing/prefix.py",
    "narwhal/core/sse.py",
    "narwhal/core/wire.py",
    "narwhal/engines/block_pool.py",
    "narwhal/live/clock.py",
    "narwhal/live/edge_counts.py",
    "narwhal/live/gate.py",
    "narwhal/live/h1client.py",
    "narwhal/live/h1request.py",
    "narwhal/live/h1server.py",
    "narwhal/live/jsonwrite.py",
    "narwhal/live/metrics.py",
    "narwhal/live/reporting.py",
    "narwhal/live/sink.py",
    "narwhal/live/transport.py",
    "narwhal/live/waits.py",
    "narwhal/sim/driver.py",
    "narwhal/sim/gpu/blocks.py",
    "narwhal/sim/gpu/engine.py",
    "narwhal/sim/gpu/handoffs.py",
    "narwhal/sim/gpu/output.py",
    "narwhal/sim/gpu/params.py",
    "narwhal/sim/gpu/prefix.py",
    "narwhal/sim/gpu/scheduler.py",
    "narwhal/sim/gpu/sequence.py",
    "narwhal/sim/gpu/stepcost.py",
    "narwhal/sim/gpu/switches.py",
    "narwhal/sim/gpu/totals.py",
    "narwhal/sim/gpu/wire.py",
    "narwhal/sim/kvnet.py",
    "narwhal/sim/runner.py",
    "narwhal/sim/streaming.py",
    "narwhal/sim/tensor_parallel.py",
    "narwhal/sim/timing.py",
]


def ext_modules() -> list[Any]:
    if os.environ.get("NARWHAL_COMPILE") != "1":
        return []
    from mypyc.build import mypycify  # only the compiled build needs mypy

    return list(mypycify(COMPILED, opt_level="3"))


setup(ext_modules=ext_modules())
