#!/usr/bin/env bash
# The placer's NVML telemetry on a real GPU, in one run from the repository root:
#   bash scripts/gpu_check.sh
# Installs the wheels in .whl/ (`scripts/gpu_wheels.sh` fetches them: pydantic, lark, orjson, pyroaring,
# cryptography, pytest-timeout, ...) into $SITE, makes `policyc` importable as a link to this
# tree, runs tests/placer/test_nvml_gpu.py and test_edges_and_sources.py, and writes
#   $OUT/gpu_check.txt  NVML readings idle and under a matmul load, the local-host topology,
#                       the refresher's tick latencies and the placement made on the real GPU;
#   $OUT/pytest.log     the full pytest log.
# $OUT defaults to a new temporary folder; `python3` is whatever is first on PATH. Exit status:
# pytest's. Every step is under `timeout`, all within BUDGET_S (225 s; about 1 minute expected).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
PKG=${PKG:-/tmp/pkg}
REPORT="$OUT/gpu_check.txt"
: >"$REPORT"
say() { echo "$@" | tee -a "$REPORT"; }
T0=$(date +%s)
DEADLINE=$((T0 + ${BUDGET_S:-225}))  # every step's timeout is cut to what is left of this
cap() { local left=$((DEADLINE - $(date +%s))); [ "$left" -lt "$1" ] && echo $((left > 5 ? left : 5)) || echo "$1"; }

say "== gpu_check $(date -u +%FT%TZ) on $(uname -n), tree $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"

# ---- wheels and import path
if ls .whl/*.whl >/dev/null 2>&1; then
  timeout "$(cap 40)" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    2>&1 | grep -v -e 'WARNING: Running pip as' -e 'WARNING: Target directory' | tail -5
  say "wheels: $(ls .whl | sed 's/-py3-none.*//; s/-cp3.*//' | tr '\n' ' ')-> $SITE"
else
  say "wheels: none in .whl/ (was it carried?)"
fi
mkdir -p "$PKG" && ln -sfn "$ROOT" "$PKG/policyc"
export PYTHONPATH="$PKG:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

# ---- the machine
say "-- nvidia-smi -L"
{ timeout 10 nvidia-smi -L 2>&1 || echo "nvidia-smi: unavailable (rc $?)"; } | tee -a "$REPORT"
{ timeout 10 nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max,ecc.mode.current --format=csv 2>/dev/null || true; } | tee -a "$REPORT"
say "-- versions"
timeout "$(cap 20)" python3 - 2>&1 <<'EOF' | tee -a "$REPORT"
import importlib, importlib.metadata as md, platform, sys
print("python", sys.version.split()[0], platform.machine(), sys.executable)
for dist in ("nvidia-ml-py", "pynvml", "numpy", "scipy", "networkx", "pydantic", "pydantic-core", "lark", "lark-cython",
             "orjson", "pyroaring", "cryptography", "pytest", "pytest-timeout", "hypothesis", "torch"):
    try:
        print(f"  {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"  {dist} -")
try:
    import pynvml
    pynvml.nvmlInit()
    print("  NVML driver", pynvml.nvmlSystemGetDriverVersion(), "/ NVML", pynvml.nvmlSystemGetNVMLVersion())
    pynvml.nvmlShutdown()
except Exception as e:
    print("  NVML:", type(e).__name__, e)
for m in ("policyc.placer", "policyc.compiler.pipeline"):  # the placer, and what tests/conftest.py pulls in
    try:
        mod = importlib.import_module(m)
        print(f"  import {m}: ok ({mod.__file__})")
    except Exception as e:
        print(f"  import {m}: FAILED {type(e).__name__}: {e}")
EOF

# ---- the tests
say "-- pytest (full log: pytest.log)"
PT=$(cap 100)
timeout "$PT" python3 -m pytest -v -rA -p no:cacheprovider -o timeout=60 \
  tests/placer/test_nvml_gpu.py tests/placer/test_edges_and_sources.py >"$OUT/pytest.log" 2>&1
RC=$?
[ $RC = 124 ] && echo "(pytest killed by timeout after $PT s)" >>"$OUT/pytest.log"
grep -E '^(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)|^=+ .*(passed|failed|skipped|error).* =+$' "$OUT/pytest.log" | tee -a "$REPORT"
say "pytest rc=$RC"

# ---- readings, topology and a placement, in words
say "-- report"
timeout "$(cap 55)" python3 - 2>&1 <<'EOF' | tee -a "$REPORT"
import sys, tempfile, threading, time
from pathlib import Path
sys.path[:0] = ["tests", "tests/placer"]
from placer_support import contract
from test_nvml_gpu import _host_source, _settle
from policyc.matcher.instance import Instance
from policyc.placer import NvmlSource, PlacementPlan, Placer, Refresher

def show(rs, indent="  "):
    for r in rs:
        print(f"{indent}gpu{r.index} {r.name} [{r.gpu_class}] bus {r.pci_bus_id} numa {r.numa_node}: sm {r.sm_util:.2f} "
              f"mem free {r.mem_free / 2**30:.1f}/{r.mem_total / 2**30:.1f} GiB clock {r.sm_clock_ratio:.2f} "
              f"pcie {r.pcie_util:.4f} ecc {r.ecc_uncorrected} health {r.health:.2f}")

n = NvmlSource()
print("NvmlSource:", n.reason)
if not n.available:
    print("no GPU: nothing more to report"); sys.exit(0)
import pynvml as p
for i in range(p.nvmlDeviceGetCount()):
    h = p.nvmlDeviceGetHandleByIndex(i)
    def raw(f, *a):
        try:
            return f(h, *a)
        except Exception as e:
            return f"({type(e).__name__})"
    print(f"  raw gpu{i}: sm clock {raw(p.nvmlDeviceGetClockInfo, p.NVML_CLOCK_SM)}/{raw(p.nvmlDeviceGetMaxClockInfo, p.NVML_CLOCK_SM)} MHz, "
          f"pcie gen {raw(p.nvmlDeviceGetCurrPcieLinkGeneration)}/{raw(p.nvmlDeviceGetMaxPcieLinkGeneration)} "
          f"x{raw(p.nvmlDeviceGetCurrPcieLinkWidth)}/{raw(p.nvmlDeviceGetMaxPcieLinkWidth)}, "
          f"pcie tx/rx {raw(p.nvmlDeviceGetPcieThroughput, p.NVML_PCIE_UTIL_TX_BYTES)}/{raw(p.nvmlDeviceGetPcieThroughput, p.NVML_PCIE_UTIL_RX_BYTES)} KB/s, "
          f"temp {raw(p.nvmlDeviceGetTemperature, 0)} C, power {raw(p.nvmlDeviceGetPowerUsage)} mW, "
          f"ecc uncorrected {raw(p.nvmlDeviceGetTotalEccErrors, p.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, p.NVML_VOLATILE_ECC)}, "
          f"NVML numa {raw(p.nvmlDeviceGetNumaNodeId) if hasattr(p, 'nvmlDeviceGetNumaNodeId') else '-'}")
t0 = time.perf_counter(); idle = n.readings(); dt = time.perf_counter() - t0
print(f"idle ({dt * 1e3:.0f} ms for one readings() call):"); show(idle)

try:
    import torch
    assert torch.cuda.is_available(), "torch has no CUDA device"
    print(f"torch {torch.__version__} CUDA {torch.version.cuda}: {torch.cuda.get_device_name(0)}")
    stop, up = threading.Event(), threading.Event()
    def work():
        a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16); b = torch.randn_like(a); c = torch.empty_like(a)
        torch.cuda.synchronize(); up.set(); k = 0
        while not stop.is_set():
            for _ in range(8):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize(); k += 8
        work.done = k
    th = threading.Thread(target=work, daemon=True); th.start()
    up.wait(60); time.sleep(0.7)
    t1 = time.perf_counter(); load = []
    for _ in range(8):
        load.append(n.readings()); time.sleep(0.15)
    stop.set(); th.join(20); _settle(n)  # let NVML's utilisation average forget the load
    secs = time.perf_counter() - t1
    print(f"under load (fp16 8192^3 matmuls on cuda:0, ~{getattr(work, 'done', 0) * 2 * 8192**3 / secs / 1e12:.0f} TFLOP/s):")
    show(load[len(load) // 2])
    print("  sm_util samples gpu0..:", [[round(r.sm_util, 2) for r in rs] for rs in load])
except Exception as e:
    print("under load: not measured:", type(e).__name__, e)

tmp = Path(tempfile.mkdtemp())
src, made_up = _host_source(tmp, n)
t = src.topology()
print("LocalHostSource topology:", "(the host has no NIC: one made up, GPUs real)" if made_up else "")
for h in t.hosts:
    print(f"  host {h.name} region {h.region} tpm {h.tpm} tee {h.tee}")
f = src.sample()
for i, x in enumerate(t.numa):
    print(f"  numa{x.node}: {len(x.cpus)} cpus, {f.numa_mem_free[i] / 2**30:.1f} GiB free")
for i, g in enumerate(t.gpus):
    print(f"  {t.gpu_key(i)} {g.model} on numa{t.numa[g.numa].node}: frame sm {f.gpu_sm_util[i]:.2f} mem free "
          f"{f.gpu_mem_free[i] / 2**30:.1f} GiB pcie {f.gpu_pcie_util[i]:.4f} health {f.gpu_health[i]:.2f}")
for i, q in enumerate(t.ports):
    print(f"  port {t.port_key(i)} numa{t.numa[q.numa].node} {q.bandwidth * 8 / 1e9:g} Gb/s rdma {q.rdma} up {bool(f.port_up[i])}")
local, remote = t.gpu_ports
print("  gpu ports (local, remote):", [(t.port_key(a) if a >= 0 else None, t.port_key(b) if b >= 0 else None) for a, b in zip(local, remote)])
print("  notes:", list(f.notes))

with Refresher(src, interval=0.2) as r:
    time.sleep(1.1)
print("refresher ticks (ms):", [round(x * 1e3, 1) for x in r.latencies()], "errors:", list(r.errors))
snap = r.current()
print("snapshot", snap.version, "scores:", {t.gpu_key(i): round(float(s), 3) for i, s in enumerate(snap.scores)},
      "health:", [round(float(x), 2) for x in snap.gpu_health])

def place(src):
    slots = src.topology().gpu_slots()
    cands = [Instance(id=f"recommender@{s.host}/{s.gpu}", model="recommender", deployment=s.to_deployment()) for s in slots]
    return Placer(Refresher(src)).place(cands, 0.2, contract())

plan = place(src)
print("placement (contract recommender, 1.2-1.5 TFLOP per request, budget 200 ms):")
if isinstance(plan, PlacementPlan):
    print(f"  -> {plan.gpu_key} {plan.gpu_model} numa {plan.numa_node} cpus {len(plan.cpus)} port {plan.rdma_port} "
          f"share {plan.share:.4f} ({plan.share_source.value}) queue depth {plan.queue_depth}")
    print("  latency", plan.latency.describe())
    for s in plan.reasons:
        print("  reason:", s)
else:
    print("  REFUSED:", plan.binding.value, plan.message)
    for x in plan.rejected:
        print("  rejected:", x)
    print("  (see the ports above: a GPU's local port is the first NIC listed on its NUMA node)")
EOF
say "== done in $(( $(date +%s) - T0 )) s; pytest rc=$RC; files in $OUT"
echo "---- pytest.log (tail)"
tail -n 60 "$OUT/pytest.log"
exit $RC
