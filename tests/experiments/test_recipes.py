"""The recipes' rules (``narwhal.experiments.recipes``) and their drawings
(``narwhal.experiments.figures``): one set of names, and validating a spec never loads the
drawing code."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

from narwhal.experiments.figures import DRAWINGS
from narwhal.experiments.recipes import RECIPES
from tests.experiments.conftest import EXPERIMENTS, REPO


def test_every_recipe_has_a_drawing_and_every_drawing_a_recipe() -> None:
    assert set(DRAWINGS) == set(RECIPES)
    for name, module in DRAWINGS.items():
        assert callable(importlib.import_module(module).draw), name


def test_validating_a_spec_loads_neither_the_figures_nor_matplotlib() -> None:
    code = textwrap.dedent(f"""
        import sys
        from narwhal.experiments.spec import load_spec
        from narwhal.experiments.sweep import prepare
        for name in ("tuning", "retries", "capacity", "diffuse", "routing", "routing-shared",
                     "flow"):
            prepare(load_spec({str(EXPERIMENTS)!r} + "/" + name + ".toml"), quick=True)
        loaded = [m for m in sys.modules if m.startswith(("narwhal.experiments.figures",
                                                          "matplotlib"))]
        print(loaded)
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
