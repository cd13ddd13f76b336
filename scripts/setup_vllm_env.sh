#!/usr/bin/env bash
# Build (or confirm) the vLLM CPU environment in .venv-vllm/: `narwhal vllm setup`, run with a
# bare Python 3.11 from this checkout (no project venv needed; see narwhal/vllm/env.py).
# Idempotent: a second run checks a stamp and exits in about a second.
# Usage: scripts/setup_vllm_env.sh [VENV_DIR] [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
exec "$PY" -m narwhal.cli vllm setup --python "$PY" "$@"
