"""A NixlConnector pair of the CPU vLLM for the diagnostics in this folder (not a benchmark).

``with running_pair(venv) as (producer, consumer):`` builds the tiny model, starts the producer
(core 0) and the consumer (core 1) of ``narwhal.vllm.processes.pair_specs``, waits until a real
KV handoff works and yields their URLs; the pair is stopped when the block ends, on SIGTERM too.
"""

from __future__ import annotations

import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from narwhal.vllm.processes import pair_specs, start_engines, stop_all  # noqa: E402
from narwhal.vllm.tiny_model import build_in_venv  # noqa: E402
from tests.vllm.handoff import wait_pair_ready  # noqa: E402


@contextmanager
def running_pair(venv: Path, prefix: str = "narwhal-pair-") -> Iterator[tuple[str, str]]:
    """The producer's and the consumer's URLs while the pair runs (logs in a temp folder)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds like Ctrl-C
    model = build_in_venv(venv / "narwhal-models" / "tiny-llama-seed0", venv=venv)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    engines = start_engines(pair_specs(model), folder, venv=venv)
    try:
        wait_pair_ready(engines[0], engines[1])
        yield engines[0].url, engines[1].url
    finally:
        stop_all(engines)
