"""Narwhal: a router for disaggregated (prefill/decode) LLM serving, and a fleet simulator.

The version below is the distribution's (``narwhal-router``): pyproject.toml reads it from here,
so ``narwhal --version`` and the package metadata cannot disagree.
"""

__version__ = "0.1.0"


def build() -> str:
    """Which build of the package is installed: ``"compiled"`` or ``"pure"``.

    The compiled build (setup.py's ``COMPILED``, mypyc) replaces the hot modules' sources with
    extension modules; an operator and the startup line should say which one serves, since the
    two differ in CPU per request. ``narwhal.live.h1server`` stands for the list: the build
    compiles all of it or none.
    """
    import importlib.util

    spec = importlib.util.find_spec("narwhal.live.h1server")
    origin = spec.origin if spec is not None else None
    return "compiled" if origin is not None and origin.endswith(".so") else "pure"
