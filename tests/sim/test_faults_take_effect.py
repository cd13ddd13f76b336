"""A fault that cannot take effect in the run is an error or a warning, never silently dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.sim.runner import run
from narwhal.sim.scenario import ScenarioError
from tests.sim.conftest import scenario


def test_an_unknown_engine_is_refused_naming_the_engines_that_exist() -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(faults=[{"kind": "crash", "engine": "http://sim-d9", "at_s": 1.0}])
    message = str(caught.value)
    assert "faults[0]: engine 'http://sim-d9' is not in the fleet" in message
    assert "http://sim-p0, http://sim-p1, http://sim-d0, http://sim-d1" in message


@pytest.mark.parametrize("at_s", [10.0, 25.0])
def test_a_fault_scheduled_at_or_after_the_workloads_end_is_refused(at_s: float) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(
            faults=[
                {"kind": "hang", "role": "decode", "at_s": 2.0},
                {"kind": "crash", "role": "decode", "at_s": at_s},
            ]
        )
    message = str(caught.value)
    assert f"faults[1].at_s: {at_s:g} s is not before the workload's end" in message
    assert "workload.duration_s = 10 s" in message and "faults[0]" not in message


# bounded by a request count, not a duration: whether a fault at 30 s happens is only known
# when the run ends (40 requests at 20 req/s arrive in about 2 s and finish long before 30 s)
COUNTED = {"workload": {"duration_s": None, "max_requests": 40}}
LATE = {"kind": "crash", "role": "decode", "at_s": 30.0, "duration_s": 5.0}
EARLY = {"kind": "hang", "role": "decode", "at_s": 0.5, "duration_s": 1.0}


def test_a_scheduled_fault_the_run_ended_before_is_reported_not_kept() -> None:
    result = run(scenario(**COUNTED, faults=[EARLY, LATE]))
    assert result.sim_end_s < 30.0
    assert [w.kind for w in result.fault_windows] == ["hang"]
    assert [f.kind for f in result.unrun_faults] == ["crash"]
    assert run(scenario(**COUNTED, faults=[EARLY])).unrun_faults == []


def test_simulate_warns_about_a_fault_that_never_happened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "late.toml"
    path.write_text(
        """
[fleet]
prefill = 1
decode = 1
model = "llama3-8b"
[workload]
kind = "poisson"
rate = 20.0
max_requests = 30
prompt = { dist = "fixed", value = 200 }
output = { dist = "fixed", value = 20 }
[[faults]]
kind = "crash"
role = "decode"
at_s = 300.0
""",
        "utf-8",
    )
    code = main(["simulate", str(path), "--out", str(tmp_path / "out"), "--no-plot",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: the fault crash on 1 decode engine(s) at 300 s never happened" in err
    faults = (tmp_path / "out" / "faults.csv").read_text("utf-8").splitlines()
    assert len(faults) == 1  # the header only: it is not recorded as if it happened
