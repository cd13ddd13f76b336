#!/usr/bin/env bash
# The compiled build (setup.py: mypyc over the simulator's hot path) in its own venv,
# .venv-compiled, so the development venv (.venv, editable, pure Python) is never shadowed.
# Needs a C compiler and Python headers. Re-run after changing a compiled module.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=$(realpath -m "${NARWHAL_COMPILED_VENV:-.venv-compiled}")
LOG="$VENV.log"  # the build's own chatter (setuptools warnings, compiler lines) goes here
quietly() { "$@" >>"$LOG" 2>&1 || { tail -n 40 "$LOG"; echo "failed: $* (log: $LOG)"; exit 1; }; }
: >"$LOG"
[ -x "$VENV/bin/python" ] || quietly "$PY" -m venv "$VENV"
quietly "$VENV/bin/pip" install --upgrade pip
quietly "$VENV/bin/pip" install 'setuptools>=77' wheel 'mypy>=1.10,<2'
quietly "$VENV/bin/pip" install '.[dev]'  # the dependencies (and a pure build, replaced next)
rm -rf build  # setuptools reuses stale objects from build/ otherwise
NARWHAL_COMPILE=1 quietly "$VENV/bin/pip" install --no-build-isolation --force-reinstall --no-deps .
# from / so that the checkout's sources are not on sys.path
(cd / && "$VENV/bin/python" - <<'PY'
import narwhal.sim.gpu.engine as engine

assert engine.__file__.endswith(".so"), f"not compiled: {engine.__file__}"
print(f"compiled build ready: {engine.__file__}")
PY
)
