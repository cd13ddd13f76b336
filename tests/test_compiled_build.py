"""The optional compiled build (setup.py, mypyc) compiles exactly the modules it lists.

On a plain install this checks the list names real modules; with ``NARWHAL_EXPECT_COMPILED=1``
(set by ``.ci/run`` when it runs the suite against ``.venv-compiled``) it also checks that every
listed module is the compiled extension, so the suite provably ran the compiled code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[1] / "setup.py"


def compiled_modules() -> list[str]:
    tree = ast.parse(SETUP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED":
            paths = ast.literal_eval(node.value)
            return [path.removesuffix(".py").replace("/", ".") for path in paths]
    raise AssertionError("setup.py has no COMPILED list")


def test_compiled_list_names_real_modules() -> None:
    modules = compiled_modules()
    assert "narwhal.sim.gpu.engine" in modules and "narwhal.core.lifecycle" in modules
    for name in modules:
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.skipif(
    os.environ.get("NARWHAL_EXPECT_COMPILED") != "1", reason="only against the compiled build"
)
def test_listed_modules_are_compiled() -> None:
    for name in compiled_modules():
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__
