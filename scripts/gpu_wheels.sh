#!/usr/bin/env bash
# Fetch, into .whl/ (git-excluded), the CPython 3.12 x86-64 wheels a GPU machine without
# network access lacks for `scripts/gpu_check.sh` and `benchmarks/serve.py` (its image has
# numpy, scipy, networkx, nvidia-ml-py, onnx, pytest, hypothesis, torch). The versions are
# this project's pins as installed in .venv; carry `.whl` (and the generated
# `server/decision_pb2.py`, `server/decision_pb2_grpc.py`) with the run:
#   bash scripts/gpu_check.sh; PYTHONPATH=/tmp/pkg:/tmp/site python3 benchmarks/serve.py
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >>.git/info/exclude; }
WHEELS=(
  annotated_types==0.8.0 cffi==2.1.1 cryptography==50.0.2 grpcio==1.85.3 grpcio_health_checking==1.81.1
  grpcio_reflection==1.81.1 lark==1.3.1 lark_cython==0.0.17 msgspec==0.23.0 orjson==3.13.0
  prometheus_client==0.26.0 protobuf==6.33.6 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5
  pyroaring==1.2.0 pyroute2==0.9.7 pytest_timeout==2.4.0 typing_extensions==4.16.0 typing_inspection==0.4.5
  uvloop==0.23.0 z3_solver==4.16.0.0
)
PLATFORMS=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
du -sh .whl
