#!/usr/bin/env bash
# The compiled wheel (setup.py: mypyc over the hot paths) into DIR (default dist/): what the
# container image installs (deploy/Containerfile) and what scripts/build_compiled.sh puts in
# .venv-compiled. The build tools (setuptools, wheel, mypy, and the dependencies mypyc reads the
# types of) go in a throwaway venv, so neither the wheel nor an environment that installs it
# depends on mypy. Needs a C compiler and the Python headers. Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=$(realpath -m "${1:-dist}")
BUILD_VENV=$(mktemp -d)
LOG="$BUILD_VENV.log"  # the build's chatter (setuptools warnings, compiler lines); kept on failure
trap 'rm -rf "$BUILD_VENV"' EXIT
quietly() { "$@" >>"$LOG" 2>&1 || { tail -n 40 "$LOG"; echo "failed: $* (log: $LOG)"; exit 1; }; }
quietly "$PY" -m venv "$BUILD_VENV"
quietly "$BUILD_VENV/bin/pip" install --upgrade pip
quietly "$BUILD_VENV/bin/pip" install 'setuptools>=77' wheel 'mypy>=1.10,<2' '.[sim]'
quietly "$BUILD_VENV/bin/pip" uninstall -y narwhal-router  # its dependencies stay: their types
rm -rf build  # setuptools reuses stale objects from build/ otherwise
mkdir -p "$OUT"
rm -f "$OUT"/narwhal_router-*.whl
NARWHAL_COMPILE=1 quietly "$BUILD_VENV/bin/pip" wheel --no-build-isolation --no-deps -w "$OUT" .
rm -rf build "$LOG"
ls "$OUT"/narwhal_router-*.whl
