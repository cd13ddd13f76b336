#!/usr/bin/env bash
# The compiled build (setup.py: mypyc over the simulator's hot path) in its own venv,
# .venv-compiled, so the development venv (.venv, editable, pure Python) is never shadowed.
# Needs a C compiler and Python headers. Re-run after changing a compiled module.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=$(realpath -m "${NARWHAL_COMPILED_VENV:-.venv-compiled}")
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q 'setuptools>=68' wheel 'mypy>=1.10,<2'
"$VENV/bin/pip" install -q '.[dev]'  # the dependencies (and a pure build, replaced next)
rm -rf build  # setuptools reuses stale objects from build/ otherwise
NARWHAL_COMPILE=1 "$VENV/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps .
# from / so that the checkout's sources are not on sys.path
(cd / && "$VENV/bin/python" - <<'PY'
import narwhal.sim.engine as engine

assert engine.__file__.endswith(".so"), f"not compiled: {engine.__file__}"
print(f"compiled build ready: {engine.__file__}")
PY
)
