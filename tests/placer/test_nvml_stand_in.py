"""NVML telemetry on a machine without a GPU: pynvml, unchanged, loads a stand-in driver
(`stand_in_nvml.c`, built here) that answers NVML's C calls from a device table the test
writes. This runs the reading code (`policyc.placer.nvml`) end to end in CI: unit
conversions, NUMA lookup, health, calls a GPU does not support, a lost GPU, a driver that
fails to load; a GPU going bad between two ticks is avoided by the placer; and the real-GPU
tests (`test_nvml_gpu.py`) run against it, so they are known to work before a GPU machine
runs them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import nvml_stand_in as stand_in
from nvml_stand_in import Gpu

NOT_SUPPORTED, DRIVER_NOT_LOADED, GPU_IS_LOST = 3, 9, 15
GiB = 2**30

READ = """
import dataclasses, json, sys
from policyc.placer.nvml import NvmlSource
n = NvmlSource(sys_root=sys.argv[1])
print(json.dumps({"available": n.available, "reason": n.reason,
                  "readings": [dataclasses.asdict(r) for r in n.readings()]}))
n.close()
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.built(tmp_path_factory)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "gpus.table"


def _read(driver: Path, table: Path, sys_root: Path | None = None) -> dict:
    return stand_in.run_python(driver, table, READ, str(sys_root or "/sys"))


def _sys_tree(root: Path, numa_of_bus: dict[str, int], nodes: tuple[int, ...] = (0, 1)) -> Path:
    """A /sys with NUMA nodes, one NIC, and the PCI devices' NUMA nodes (sysfs spells a bus
    id with a 4-digit domain, in lower case)."""
    for n in nodes:
        d = root / "devices/system/node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(f"{n * 4}-{n * 4 + 3}\n")
        (d / "meminfo").write_text(f"Node {n} MemFree:       {64 * 2**20} kB\n")
    nic = root / "class/net/eth0"
    (nic / "statistics").mkdir(parents=True)
    (nic / "device").mkdir()
    for rel, text in (("speed", "100000"), ("operstate", "up"), ("statistics/rx_bytes", "0"),
                      ("statistics/tx_bytes", "0"), ("device/numa_node", "0")):
        (nic / rel).write_text(text)
    for bus, node in numa_of_bus.items():
        dom, _, rest = bus.partition(":")
        d = root / "bus/pci/devices" / f"{dom[-4:]}:{rest}".lower()
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return root


def test_readings_are_what_the_driver_reports(driver: Path, table: Path, tmp_path: Path) -> None:
    gpus = [
        Gpu(name="NVIDIA H100 80GB HBM3", bus_id="00000000:3B:00.0", sm_util=40, mem_total=80 * GiB, mem_free=60 * GiB,
            pcie_tx=2_000_000, pcie_rx=500_000, link_gen=5, link_width=16),
        # throttled under load: SM clock below half its maximum at 90 % utilisation
        Gpu(name="NVIDIA A100-SXM4-80GB", bus_id="00000000:86:00.0", sm_util=90, sm_clock=600, max_sm_clock=1410,
            pcie_rx=7_000_000, link_gen=4, link_width=16),
        # uncorrected ECC errors; its bus id is not under /sys, so it is on NUMA node 0
        Gpu(name="NVIDIA L4", bus_id="00000000:C1:00.0", sm_util=5, mem_total=24 * GiB, mem_free=20 * GiB,
            ecc_uncorrected=2, link_gen=4, link_width=8),
    ]
    stand_in.write_table(table, gpus)
    out = _read(driver, table, _sys_tree(tmp_path / "sys", {"00000000:3B:00.0": 1, "00000000:86:00.0": 0}))
    assert out["available"] and out["reason"] == "NVML: 3 GPU(s)"
    h100, a100, l4 = out["readings"]
    assert [r["index"] for r in out["readings"]] == [0, 1, 2]
    assert (h100["name"], h100["gpu_class"], h100["pci_bus_id"], h100["numa_node"]) == (
        "NVIDIA H100 80GB HBM3", "H100", "00000000:3B:00.0", 1)
    assert (h100["sm_util"], h100["mem_total"], h100["mem_free"]) == (0.4, 80.0 * GiB, 60.0 * GiB)
    # NVML's PCIe counters are KB/s; the link is gen 5 (3.94 GB/s a lane) x 16
    assert h100["pcie_util"] == pytest.approx(2_000_000 * 1024 / (3.94e9 * 16))
    assert (h100["sm_clock_ratio"], h100["ecc_uncorrected"], h100["health"]) == (1.0, 0, 1.0)
    assert (a100["gpu_class"], a100["numa_node"]) == ("A100-80G", 0)
    assert a100["sm_clock_ratio"] == pytest.approx(600 / 1410) and a100["health"] == 0.5
    assert a100["pcie_util"] == pytest.approx(7_000_000 * 1024 / (1.97e9 * 16))
    assert (l4["gpu_class"], l4["numa_node"], l4["ecc_uncorrected"], l4["health"]) == ("L4", 0, 2, 0.0)
    assert l4["pcie_util"] == 0.0


def test_calls_a_gpu_does_not_support_read_as_their_defaults(driver: Path, table: Path) -> None:
    unsupported = ("nvmlDeviceGetPcieThroughput", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetClockInfo",
                   "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetTotalEccErrors")
    stand_in.write_table(table, [Gpu(sm_util=95, pcie_tx=9_000_000, ecc_uncorrected=4,
                                     failing=tuple((c, NOT_SUPPORTED) for c in unsupported))])
    (r,) = _read(driver, table)["readings"]
    assert not r["name"].startswith("error"), r
    # no throughput, no clocks (so no throttling seen), no ECC counter: a healthy GPU at 95 %
    assert (r["pcie_util"], r["sm_clock_ratio"], r["ecc_uncorrected"], r["health"], r["sm_util"]) == (0.0, 1.0, 0, 1.0, 0.95)


def test_a_lost_gpu_is_a_failed_reading_not_a_failed_collector(driver: Path, table: Path) -> None:
    stand_in.write_table(table, [Gpu(), Gpu(bus_id="00000000:86:00.0", failing=(("nvmlDeviceGetUtilizationRates", GPU_IS_LOST),))])
    out = _read(driver, table)
    ok, lost = out["readings"]
    assert ok["name"] == "NVIDIA H100 80GB HBM3" and ok["health"] == 1.0
    assert re.fullmatch(r"error: NVMLError_\w+", lost["name"]), lost
    assert (lost["index"], lost["gpu_class"], lost["health"], lost["mem_free"]) == (1, "unknown", 0.0, 0.0)


@pytest.mark.parametrize(("gpus", "init_error", "reason"), [
    ([Gpu()], DRIVER_NOT_LOADED, r"no NVIDIA GPU / NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded"),
    ([], 0, r"no NVIDIA GPU / NVML unavailable: NVML reports 0 devices"),
], ids=["driver-not-loaded", "no-devices"])
def test_a_driver_without_gpus_is_reported_not_raised(driver: Path, table: Path, gpus: list[Gpu], init_error: int,
                                                      reason: str) -> None:
    stand_in.write_table(table, gpus, init_error=init_error)
    out = _read(driver, table)
    assert not out["available"] and out["readings"] == []
    assert re.fullmatch(reason, out["reason"]), out["reason"]


GOES_BAD = """
import dataclasses, json, sys
from pathlib import Path

sys.path.insert(0, "tests/placer")
from nvml_stand_in import Gpu, write_table
from placer_support import contract

from policyc.matcher.instance import Instance
from policyc.placer import LocalHostSource, NvmlSource, PlacementPlan, Placer, Refresher

table, root = Path(sys.argv[1]), sys.argv[2]
gpus = [Gpu(bus_id="00000000:3B:00.0", sm_util=10), Gpu(bus_id="00000000:86:00.0", sm_util=30)]
write_table(table, gpus)
src = LocalHostSource(sys_root=root, nvml=NvmlSource(sys_root=root), hostname="gpu-node")
cands = [Instance(id=f"recommender@{s.host}/{s.gpu}", model="recommender", deployment=s.to_deployment())
         for s in src.topology().gpu_slots()]
r = Refresher(src)
placer = Placer(r)


def place():
    r.tick()
    p = placer.place(cands, 0.2, contract())
    if isinstance(p, PlacementPlan):
        return {"gpu": p.gpu, "numa": p.numa_node, "cpus": list(p.cpus)}
    return {"refused": p.binding.value, "why": str(p)}


steps = [place()]
bad = int(steps[0]["gpu"][3:])
gpus[bad] = dataclasses.replace(gpus[bad], ecc_uncorrected=1)
write_table(table, gpus)
steps.append(place())
gpus[1 - bad] = dataclasses.replace(gpus[1 - bad], failing=(("nvmlDeviceGetUtilizationRates", 15),))
write_table(table, gpus)
steps.append(place())
print(json.dumps(steps))
"""


def test_a_gpu_going_bad_between_ticks_is_avoided_on_the_next(driver: Path, table: Path, tmp_path: Path) -> None:
    root = _sys_tree(tmp_path / "sys", {"00000000:3B:00.0": 0, "00000000:86:00.0": 1})
    first, after_ecc, after_loss = stand_in.run_python(driver, table, GOES_BAD, str(table), str(root))
    # the idler GPU first; its NUMA node's CPUs with it
    assert first == {"gpu": "gpu0", "numa": 0, "cpus": [0, 1, 2, 3]}, first
    # uncorrected ECC errors on it: the next tick places on the other GPU, next to its own node
    assert after_ecc == {"gpu": "gpu1", "numa": 1, "cpus": [4, 5, 6, 7]}, after_ecc
    # that one lost too: no GPU is fit, and the answer says which constraint binds
    assert "refused" in after_loss and after_loss["refused"] == "health", after_loss


def test_the_real_gpu_tests_pass_on_the_stand_in(driver: Path, table: Path) -> None:
    """`test_nvml_gpu.py` skips on this machine; against the stand-in it runs (all but the
    CUDA workload test, which needs torch with a GPU)."""
    stand_in.write_table(table, [Gpu(), Gpu(name="NVIDIA H200", bus_id="00000000:86:00.0", sm_util=0, mem_total=141 * GiB,
                                         mem_free=140 * GiB)])
    p = stand_in.run_pytest(driver, table, "tests/placer/test_nvml_gpu.py", "-rs")
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    assert re.fullmatch(r"4 passed, 1 skipped in .*", tail), p.stdout
    assert "no GPU workload to measure" in p.stdout, p.stdout
