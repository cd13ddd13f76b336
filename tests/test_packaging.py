"""What an install gets: the router without the simulator's stack, the version, the license."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import files, metadata
from pathlib import Path

import pytest

import narwhal
from narwhal.cli import SIM_EXTRA_MODULES, main

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


IMPORT_NAMES = {"pyyaml": "yaml"}  # distributions whose import name differs


def _names(requirements: list[str]) -> set[str]:
    names = {
        r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for r in requirements
    }
    return {IMPORT_NAMES.get(name, name) for name in names}


def test_the_router_install_leaves_the_simulator_stack_to_its_extra() -> None:
    project = PYPROJECT["project"]
    assert _names(project["optional-dependencies"]["sim"]) == SIM_EXTRA_MODULES
    assert not SIM_EXTRA_MODULES & _names(project["dependencies"])


def test_serving_imports_nothing_of_the_simulator_stack() -> None:
    code = textwrap.dedent("""
        import sys
        import narwhal.live.app, narwhal.live.commands, narwhal.live.preflight
        import narwhal.engines.client, narwhal.emulator.app, narwhal.config_file
        print(sorted(m for m in ("simpy", "matplotlib", "tqdm") if m in sys.modules))
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_simulator_command_without_its_extra_says_how_to_install_it() -> None:
    code = "import sys; sys.modules['simpy'] = None; from narwhal.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "simulate", "--no-plot", "--out", "unused"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "pip install 'narwhal-router[sim]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_version_and_license_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    """The installed distribution's own metadata (editable or the compiled build alike)."""
    meta = metadata("narwhal-router")
    assert (meta["Version"], meta["License-Expression"]) == (narwhal.__version__, "Apache-2.0")
    license_files = [f for f in files("narwhal-router") or [] if f.name == "LICENSE"]
    assert license_files and "Apache License" in license_files[0].read_text()
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"narwhal {narwhal.__version__}"
