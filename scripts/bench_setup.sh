#!/usr/bin/env bash
# The SLO-attainment benchmark's peers (benchmarks/slo_attainment.py): vllm-router and
# sglang-router (Rust binaries in their wheels) in their own venv, .venv-routers (gitignored),
# and its load generator, inference-perf, in .venv-perf.
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
# the load generator: inference-perf (the Inference Extension's), which needs Python >= 3.12
# (beside 3.11 under pyenv here), in .venv-perf (gitignored; ~790 MB, no torch)
PERF=.venv-perf
if [ ! -x "$PERF/bin/inference-perf" ]; then
    PY312=""
    for py in python3.12 python3.13 $(ls -d "$(pyenv root 2> /dev/null)"/versions/3.1[2-9]*/bin/python3 2> /dev/null); do
        # the first that runs and is >= 3.12 (a pyenv shim for a version not selected is found but fails)
        if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2> /dev/null; then
            PY312=$py
            break
        fi
    done
    if [ -z "$PY312" ]; then
        echo "bench_setup: inference-perf needs Python >= 3.12 and none was found (python3.12, pyenv)" >&2
        exit 1
    fi
    "$PY312" -m venv "$PERF"
    "$PERF/bin/pip" install -q "inference-perf==0.7.0"
fi
"$PERF/bin/inference-perf" --help > /dev/null
echo "inference-perf ready in $PERF"
