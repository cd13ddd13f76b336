#!/usr/bin/env bash
# The peer routers and py-spy, in their own venv (never the project's): benchmarks/router/.venv-peers.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$here/.venv-peers"
"$here/.venv-peers/bin/pip" install --quiet vllm-router==0.1.17 smg==1.13.0 py-spy
"$here/.venv-peers/bin/pip" show vllm-router smg py-spy | grep -E '^(Name|Version)'
