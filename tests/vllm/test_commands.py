"""(default run, no vLLM) The real-engine subcommands (``narwhal.vllm.commands``): ``narwhal
calibrate`` end to end against an emulated pair, its refusals before any measuring, and
``narwhal vllm launch`` on a fake ``vllm``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from narwhal.cli import build_parser, main
from narwhal.core.config import parse_config
from narwhal.emulator.timing import LinearTiming
from narwhal.sim.scenario import parse_scenario
from narwhal.vllm import calibrate, commands
from narwhal.vllm.tiny_model import STAMP, stamp_for
from tests.live.conftest import Servers, start_emulator
from tests.vllm.fakes import fake_venv
from tests.vllm.harness import REPO


def test_calibrate_measures_an_emulated_pair_and_writes_a_simulator_fleet(
    servers: Servers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timing = LinearTiming(decode_s_per_token=0.002)
    producer = start_emulator(servers, role="prefill", timing=timing)
    consumer = start_emulator(servers, role="decode", timing=timing)
    out, data_path = tmp_path / "fleet.toml", tmp_path / "calibration.json"
    code = main(
        ["calibrate", "--engine", producer.url, "--decode-engine", consumer.url,
         "--lengths", "16,64", "--batches", "1,2", "--repeats", "2", "--tokens", "8",
         "--handoff-tokens", "5", "--out", str(out), "--json", str(data_path)]
    )  # fmt: skip
    captured = capsys.readouterr()
    report = captured.out
    assert code == 0
    assert "decode right after a KV pull (median over handoffs): " in report
    progress = [line for line in captured.err.splitlines() if line.startswith("calibrate: ")]
    assert progress[0] == "calibrate: handoff 1/4 (16-token prompt)"  # one line per measurement
    assert progress[-1] == "calibrate: decode 4/4 (batch of 2)" and len(progress) == 8
    assert "fit error (mean |relative|): " in report
    data = json.loads(data_path.read_text())
    assert len(data["handoffs"]) == 4 and len(data["steps"]) == 4
    assert data["handoff_decode_s_per_token"] > 0
    assert set(data["fit_error"]) == {"prefill", "step", "first_token", "all"}
    linear = tomllib.loads(out.read_text())["fleet"]["linear"]
    assert all(value >= 0 for value in linear.values()) and linear["decode_s_per_token"] > 0
    workload = '\n[workload]\nkind = "fixed"\narrivals_s = [0.0]\nprompt_tokens = 10\n'
    assert parse_scenario(tomllib.loads(out.read_text() + workload)).fleet.prefill == 1


def test_command_is_registered_with_the_calibration_defaults() -> None:
    args = build_parser().parse_args(
        ["calibrate", "--engine", "http://e", "--batches", "1,4", "--out", "f.toml"]
    )
    assert args.batches == [1, 4] and args.decode_engine is None and args.statistic == "median"
    assert args.lengths is None  # calibrate's own defaults, which the help states:
    assert ",".join(map(str, calibrate.DEFAULT_LENGTHS)) == commands.DEFAULT_LENGTHS
    assert ",".join(map(str, calibrate.DEFAULT_BATCHES)) == commands.DEFAULT_BATCHES
    assert (
        args.handoff_tokens == commands.DEFAULT_HANDOFF_TOKENS == calibrate.DEFAULT_HANDOFF_TOKENS
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calibrate", "--engine", "http://e", "--batches", "0"])


@pytest.mark.parametrize("lengths", ["16", "16,16", "16,abc", "0,16"])
def test_a_list_that_cannot_be_fitted_is_refused_at_once(lengths: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calibrate", "--engine", "http://e", "--lengths", lengths])


def test_an_unwritable_output_is_refused_before_any_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the engine is unreachable: measuring would end in exit 1, refusing first gives 2
    missing = tmp_path / "absent" / "fleet.toml"
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", "--out", str(missing)]) == 2
    assert f"--out: no such directory: {missing.parent}" in capsys.readouterr().err
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", "--json", str(tmp_path)]) == 2


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (["--repeats", "0"], "--repeats must be >= 1 and --tokens >= 8"),
        (["--tokens", "7"], "--repeats must be >= 1 and --tokens >= 8"),
        (["--handoff-tokens", "1"], "--handoff-tokens must be >= 2"),
    ],
)
def test_too_few_repeats_or_tokens_are_refused(
    counts: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the engine is unreachable: measuring would end in exit 1, refusing first gives 2
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", *counts]) == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_engine_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--engine", "http://127.0.0.1:9", "--repeats", "1"]) == 1
    assert "calibrate: ConnectError" in capsys.readouterr().err


def test_building_the_parser_needs_only_the_standard_library() -> None:
    """What lets ``scripts/setup_vllm_env.sh`` run ``narwhal vllm setup`` on a bare Python, and
    ``narwhal vllm tiny-model`` run inside the vLLM venv."""
    code = textwrap.dedent("""
        import sys
        before = set(sys.modules)
        from narwhal.cli import build_parser
        build_parser()
        top = {name.split(".")[0] for name in set(sys.modules) - before}
        print(sorted(n for n in top if n not in sys.stdlib_module_names
                     and n != "narwhal" and not n.endswith("__mypyc")))
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_ports_are_four_numbers_or_free() -> None:
    assert commands.port_list("8100,5559,8200,5560") == (8100, 5559, 8200, 5560)
    assert commands.port_list("free") is None
    for bad in ("8100,5559", "a,b,c,d", "0,1,2,3"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"four ports|port numbers"):
            commands.port_list(bad)


def test_launch_runs_a_pair_until_interrupted_and_stops_every_group(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path / "venv")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / STAMP).write_text(json.dumps(stamp_for(0)))  # built: the fake venv needs no torch
    config = tmp_path / "narwhal.toml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "narwhal.cli", "vllm", "launch", str(model), str(tmp_path / "logs"),
         "--ports", "free", "--config", str(config), "--venv", str(venv)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        end = time.monotonic() + 60
        while not any(line.startswith("  consumer: ") for line in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < end, "".join(lines)
            lines.append(line)
        assert any(line.startswith("healthy after ") for line in lines)
        fleet = parse_config(tomllib.loads(config.read_text()))
        for engine in fleet.engines:
            assert httpx.get(engine.url + "/health", timeout=5).status_code == 200
        children = [int(path.read_text()) for path in model.glob("child-*.pid")]
        assert len(children) == 2
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    for engine in fleet.engines:
        with pytest.raises(httpx.HTTPError):
            httpx.get(engine.url + "/health", timeout=2)
    for pid in children:  # each engine's EngineCore stand-in went with its group
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
