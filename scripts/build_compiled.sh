#!/usr/bin/env bash
# The compiled build in its own venv, .venv-compiled: the dependencies with the dev extra, then
# the compiled wheel (scripts/build_wheel.sh, the one the container image installs) in place of
# the package, so the development venv (.venv, editable, pure Python) is never shadowed.
# Needs a C compiler and Python headers. Re-run after changing a compiled module.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=$(realpath -m "${NARWHAL_COMPILED_VENV:-.venv-compiled}")
LOG="$VENV.log"  # pip's chatter goes here
quietly() { "$@" >>"$LOG" 2>&1 || { tail -n 40 "$LOG"; echo "failed: $* (log: $LOG)"; exit 1; }; }
: >"$LOG"
[ -x "$VENV/bin/python" ] || quietly "$PY" -m venv "$VENV"
quietly "$VENV/bin/pip" install --upgrade pip
quietly "$VENV/bin/pip" install '.[dev]'  # the dependencies (and a pure build, replaced next)
WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
PYTHON="$PY" bash scripts/build_wheel.sh "$WHEELS"
quietly "$VENV/bin/pip" install --force-reinstall --no-deps "$WHEELS"/narwhal_router-*.whl
# from / so that the checkout's sources are not on sys.path
(cd / && "$VENV/bin/python" - <<'PY'
import narwhal.sim.gpu.engine as engine

assert engine.__file__.endswith(".so"), f"not compiled: {engine.__file__}"
print(f"compiled build ready: {engine.__file__}")
PY
)
