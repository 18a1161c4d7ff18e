#!/usr/bin/env bash
# The SLO-attainment benchmark's peers (benchmarks/slo_attainment.py): vllm-router and
# sglang-router (Rust binaries in their wheels) in their own venv, .venv-routers (gitignored).
# Not part of scripts/setup.sh: CI does not install them. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-routers
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if [ ! -x "$VENV/bin/vllm-router" ] || [ ! -x "$VENV/bin/sglang-router" ]; then
    "$VENV/bin/pip" install -q "vllm-router==0.1.17" "sglang-router==0.3.2"
fi
"$VENV/bin/vllm-router" --help > /dev/null
"$VENV/bin/sglang-router" launch --help > /dev/null
echo "peer routers ready in $VENV"
