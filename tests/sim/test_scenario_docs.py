"""docs/simulator.md's scenario reference names every key a scenario takes: a key added to a
scenario model and not to the docs fails here (a scenario writer should never need the source)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from narwhal.sim.faults import FaultSpec
from narwhal.sim.scenario import FleetSettings, LinearTimingSettings, SimSettings
from narwhal.sim.shared_context import RateStage, SharedContextSettings
from narwhal.sim.workload import LengthDist, WorkloadClass, WorkloadSettings
from tests.compiled_stage import EXPECT_COMPILED

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
MODELS: tuple[type[BaseModel], ...] = (
    FleetSettings, LinearTimingSettings, WorkloadSettings, LengthDist, SharedContextSettings,
    RateStage, FaultSpec, SimSettings, WorkloadClass,
)  # fmt: skip


@pytest.mark.skipif(EXPECT_COMPILED, reason="the compiled stage copies no docs/")
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_scenario_key_is_in_the_reference(model: type[BaseModel]) -> None:
    text = DOC.read_text("utf-8")
    reference = text[text.index("## The engine model") : text.index("## Metrics")]
    missing = [key for key in model.model_fields if f"`{key}`" not in reference]
    assert not missing, f"docs/simulator.md does not name {model.__name__}'s {missing}"
