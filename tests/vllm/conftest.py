"""Fixtures of the real-vLLM suite (``pytest -m vllm``; the default run deselects it).

The vLLM CPU env must exist (``scripts/setup_vllm_env.sh``); without it the suite is skipped,
or fails when ``NARWHAL_VLLM_REQUIRED=1`` (CI). Engines start ONCE per session, all three at
once: a NixlConnector producer (core 0) and consumer (core 1), and one plain engine whose greedy
output is the reference. Each test gets its own ``narwhal serve`` with the config it needs; the
``pair`` fixture restarts an engine a previous test stopped or killed, so tests are independent
of order (the destructive ones still run last, to avoid paying for restarts).
Set ``NARWHAL_VLLM_LOG_DIR`` to keep the engines' and routers' logs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narwhal.vllm.processes import (
    EngineProcess,
    EngineSpec,
    free_port,
    pair_specs,
    start_engines,
    stop_all,
)
from narwhal.vllm.tiny_model import build_in_venv
from tests.live.conftest import servers  # noqa: F401 (a fixture the default-run tests here share)
from tests.vllm.handoff import wait_pair_ready
from tests.vllm.harness import Narwhal, config_text

VENV = Path(os.environ.get("NARWHAL_VLLM_VENV", Path(__file__).resolve().parents[2] / ".venv-vllm"))
TIMINGS: dict[str, float] = {}
NOTES: list[str] = []


@dataclass
class Fleet:
    producer: EngineProcess
    consumer: EngineProcess
    single: EngineProcess

    def ensure_pair(self) -> None:
        """Thaw both, and restart any of the pair that is not alive and healthy."""
        restarted = False
        for engine in (self.producer, self.consumer):
            engine.thaw()
            if not (engine.alive() and engine.healthy()):
                TIMINGS[f"restart {engine.spec.name}"] = engine.restart()
                restarted = True
        if restarted:
            self.pair_ready()

    def pair_ready(self) -> None:
        """A direct handoff works (after a restart, the peers re-handshake first)."""
        errors = wait_pair_ready(self.producer, self.consumer)
        if errors:
            NOTES.append(f"handoffs failed before the pair was ready again: {errors}")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("NARWHAL_VLLM_LOG_DIR")
    if wanted:
        path = Path(wanted)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (VENV / "bin" / "vllm").exists():
        message = f"no vLLM CPU env at {VENV}: run scripts/setup_vllm_env.sh"
        if os.environ.get("NARWHAL_VLLM_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    started = time.monotonic()
    path = build_in_venv(VENV / "narwhal-models" / "tiny-llama-seed0", seed=0, venv=VENV)
    TIMINGS["tiny model"] = time.monotonic() - started
    return path


@pytest.fixture(scope="session")
def fleet(model_dir: Path, log_dir: Path) -> Iterator[Fleet]:
    started = time.monotonic()
    producer, consumer = pair_specs(model_dir)
    single = EngineSpec("single", model_dir, free_port(), cpu="0-1")
    engines = start_engines([producer, consumer, single], log_dir, venv=VENV)
    TIMINGS["engines healthy (pair + reference, in parallel)"] = time.monotonic() - started
    try:
        running = Fleet(*engines)
        running.pair_ready()  # the first NIXL handshake, before any test measures anything
        yield running
    finally:
        stop_all(engines)


@pytest.fixture
def pair(fleet: Fleet) -> Fleet:
    """The fleet, with producer and consumer alive, thawed and healthy."""
    fleet.ensure_pair()
    return fleet


@pytest.fixture
def narwhal(
    pair: Fleet, tmp_path: Path, log_dir: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Narwhal]]:
    """Start ``narwhal serve`` in front of the pair: ``narwhal(engine={...}, recovery={...})``."""
    started: list[Narwhal] = []

    def start(**overrides: Any) -> Narwhal:
        config = tmp_path / f"narwhal-{len(started)}.toml"
        config.write_text(config_text(pair.producer, pair.consumer, **overrides))
        name = request.node.name.replace("/", "_").replace("[", "-").replace("]", "")
        router = Narwhal(config, log_dir / f"narwhal-{name}-{len(started)}.log")
        started.append(router)
        return router.start()

    try:
        yield start
    finally:
        for router in started:
            router.stop()
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:  # shown with the failure
            for router in started:
                print(f"--- {router.log_path.name} (tail)\n{router.log()[-3000:]}")
            for engine in (pair.producer, pair.consumer):
                print(f"--- {engine.spec.name} log (tail)\n{engine.log_tail(25)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.report_call = report  # type: ignore[attr-defined]
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "real vLLM timings")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name}: {seconds:.1f} s")
    for note in NOTES:
        terminalreporter.write_line(f"note: {note}")
