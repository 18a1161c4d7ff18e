"""NVML telemetry on a real NVIDIA GPU: readings, the local-host source built on them, and a
placement made on the GPU. Every test here is skipped, saying so, where NVML finds no
NVIDIA GPU (`test_edges_and_sources.py` covers that machine); the load test also needs
torch with CUDA. `scripts/gpu_check.sh` runs this file on a GPU machine, and
`test_nvml_stand_in.py` runs it everywhere against a stand-in NVML driver.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from placer_support import contract

from policyc.matcher.instance import Instance
from policyc.placer import LocalHostSource, NoPlacement, NvmlSource, PlacementPlan, Placer, Refresher
from policyc.placer.catalog import GPU_CLASS_NAMES
from policyc.placer.nvml import NVML_UNAVAILABLE, GpuReading, gpu_class
from policyc.placer.plan import Constraint

_PROBE = NvmlSource()
HAS_GPU = _PROBE.available
NO_GPU = f"no NVIDIA GPU on this machine: {_PROBE.reason.removeprefix(NVML_UNAVAILABLE + ': ')}"
_PROBE.close()
pytestmark = pytest.mark.skipif(not HAS_GPU, reason=NO_GPU)

BUS_ID = re.compile(r"^[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", re.IGNORECASE)  # NVML: 00000000:19:00.0
FRACTIONS = ("sm_util", "pcie_util", "sm_clock_ratio", "health")


@pytest.fixture
def nvml() -> Iterator[NvmlSource]:
    n = NvmlSource()
    try:
        yield n
    finally:
        n.close()


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _direct(i: int) -> tuple[str, str, int]:
    """(name, PCI bus id, memory total) of GPU `i`, read through pynvml itself."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    return _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetPciInfo(h).busId), pynvml.nvmlDeviceGetMemoryInfo(h).total


def _host_numa_nodes() -> list[int]:
    return sorted(int(p.name[4:]) for p in Path("/sys/devices/system/node").glob("node[0-9]*"))


def _sysfs_numa(bus: str) -> int | None:
    dom, _, rest = bus.partition(":")
    try:
        return int(Path(f"/sys/bus/pci/devices/{dom[-4:]}:{rest}".lower(), "numa_node").read_text())
    except (OSError, ValueError):
        return None


def _check_fractions(r: GpuReading) -> None:
    for f in FRACTIONS:
        v = getattr(r, f)
        assert 0.0 <= v <= 1.0, f"gpu{r.index} ({r.name}): {f} = {v!r} is not a fraction"


# ---------------------------------------------------------------------------------- readings


def test_nvml_reads_every_gpu(nvml: NvmlSource) -> None:
    import pynvml

    count = pynvml.nvmlDeviceGetCount()
    assert nvml.available and nvml.reason == f"NVML: {count} GPU(s)"
    readings = nvml.readings()
    assert [r.index for r in readings] == list(range(count))
    nodes = _host_numa_nodes()
    for r in readings:
        name, bus, total = _direct(r.index)
        assert not r.name.startswith("error"), f"gpu{r.index}: a reading failed: {r}"
        assert r.name == name and r.gpu_class == gpu_class(name)
        if "H200" in name:
            assert r.gpu_class == "H200"
        assert r.mem_total == float(total) > 0 and 0.0 <= r.mem_free <= r.mem_total
        _check_fractions(r)
        assert r.sm_clock_ratio > 0.0, f"gpu{r.index}: no SM clock reported ({r})"
        assert r.ecc_uncorrected >= 0 and (r.health == 0.0) == (r.ecc_uncorrected > 0)
        assert BUS_ID.match(r.pci_bus_id) and r.pci_bus_id == bus
        assert r.numa_node >= 0 and (r.numa_node in nodes if nodes else r.numa_node == 0)
        sysfs = _sysfs_numa(bus)
        if sysfs is not None:
            assert r.numa_node == max(0, sysfs)
    assert len({r.pci_bus_id for r in readings}) == count


def _torch_cuda() -> Any:
    try:
        import torch
    except Exception as e:
        pytest.skip(f"torch is not importable here ({type(e).__name__}: {e}): no GPU workload to measure")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here: no GPU workload to measure")
    return torch


def _nvml_index_of(torch: Any, readings: tuple[GpuReading, ...]) -> int | None:
    """The NVML index of torch's cuda:0 (CUDA and NVML may order GPUs differently)."""
    p = torch.cuda.get_device_properties(0)
    want = (getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None))
    if None in want:
        return None
    for r in readings:
        dom, bus, rest = r.pci_bus_id.split(":")
        if (int(dom, 16), int(bus, 16), int(rest.split(".")[0], 16)) == want:
            return r.index
    return None


def _settle(nvml: NvmlSource, timeout: float = 5.0) -> None:
    """Wait (a few seconds at most) for NVML's utilisation average to forget a workload, so
    the tests after this one read an idle GPU."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(r.sm_util >= 0.5 for r in nvml.readings()):
        time.sleep(0.2)


def test_sm_utilisation_rises_while_a_gpu_workload_runs(nvml: NvmlSource) -> None:
    torch = _torch_cuda()
    idle = []
    for _ in range(4):
        idle.append(nvml.readings())
        time.sleep(0.2)
    started, stop, errors = threading.Event(), threading.Event(), []

    def work() -> None:
        try:
            dev = torch.device("cuda", 0)
            a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
            b = torch.randn_like(a)
            c = torch.empty_like(a)
            torch.cuda.synchronize(dev)
            started.set()
            while not stop.is_set():
                for _ in range(8):
                    torch.matmul(a, b, out=c)
                torch.cuda.synchronize(dev)
        except Exception as e:  # reported below
            errors.append(e)
            started.set()

    th = threading.Thread(target=work, name="matmul-load", daemon=True)
    th.start()
    try:
        assert started.wait(45), "the CUDA workload did not start within 45 s"
        assert not errors, f"the CUDA workload failed: {errors[0]!r}"
        time.sleep(0.7)  # NVML utilisation is averaged over its last sample period
        load = []
        for _ in range(12):
            load.append(nvml.readings())
            time.sleep(0.15)
    finally:
        stop.set()
        th.join(30)
        _settle(nvml)
    assert not errors, f"the CUDA workload failed: {errors[0]!r}"
    i = _nvml_index_of(torch, idle[0])
    gpus = [i] if i is not None else list(range(len(idle[0])))
    idle_sm = float(np.median([max(rs[g].sm_util for g in gpus) for rs in idle]))
    peak = max(rs[g].sm_util for rs in load for g in gpus)
    assert peak >= 0.5 and peak >= idle_sm + 0.3, f"SM utilisation idle {idle_sm:.2f}, under matmuls at most {peak:.2f}"
    for rs in load:
        for r in rs:
            _check_fractions(r)
    if i is not None:  # the workload's CUDA context and tensors took memory on that GPU
        assert min(rs[i].mem_free for rs in load) < min(rs[i].mem_free for rs in idle)


# ---------------------------------------------------------------------------------- the host source


def _host_source(tmp_path: Path, nvml: NvmlSource) -> tuple[LocalHostSource, bool]:
    """The local host over the real /sys and NVML. A GPU with no NIC on its host has no
    path, so where the machine has none (a container without a network) the host is read
    from a copy of /sys's NUMA nodes plus one made-up NIC: (source, NIC made up)."""
    src = LocalHostSource(nvml=nvml)
    if src.topology().ports:
        return src, False
    for node in Path("/sys/devices/system/node").glob("node[0-9]*"):
        d = tmp_path / "devices/system/node" / node.name
        d.mkdir(parents=True)
        for f in ("cpulist", "meminfo"):
            (d / f).write_text((node / f).read_text())
    nic = tmp_path / "class/net/eth0"
    (nic / "statistics").mkdir(parents=True)
    (nic / "device").mkdir()
    numa = nvml.readings()[0].numa_node
    for rel, text in (("speed", "100000"), ("operstate", "up"), ("statistics/rx_bytes", "0"),
                      ("statistics/tx_bytes", "0"), ("device/numa_node", str(numa))):
        (nic / rel).write_text(text)
    return LocalHostSource(sys_root=str(tmp_path), nvml=nvml), True


def test_local_host_source_takes_its_gpus_from_nvml(nvml: NvmlSource) -> None:
    src = LocalHostSource(nvml=nvml)
    t = src.topology()
    readings = nvml.readings()
    assert len(t.gpus) == len(readings) > 0
    assert [g.gpu_id for g in t.gpus] == [f"gpu{r.index}" for r in readings]
    assert [g.model for g in t.gpus] == [r.gpu_class for r in readings]
    nodes = [n.node for n in t.numa]
    for g, r in zip(t.gpus, readings):
        assert t.numa[g.numa].node == (r.numa_node if r.numa_node in nodes else nodes[0])
    host = os.uname().nodename
    assert [(s.host, s.gpu, s.gpu_model) for s in t.gpu_slots()] == [(host, f"gpu{r.index}", r.gpu_class) for r in readings]
    assert all(g in t.graph() for g in (f"{host}/gpu{r.index}" for r in readings))

    frame = src.sample()
    after = nvml.readings()
    assert not any(NVML_UNAVAILABLE in n for n in frame.notes), frame.notes
    for i, r in enumerate(after):
        # an all-idle frame has 0 bytes free: these figures were filled in from NVML
        assert 0.0 < frame.gpu_mem_free[i] <= r.mem_total
        assert abs(frame.gpu_mem_free[i] - r.mem_free) <= 0.05 * r.mem_total
        assert 0.0 <= frame.gpu_sm_util[i] <= 1.0 and 0.0 <= frame.gpu_pcie_util[i] <= 1.0
        # health is 1, halved while throttled under load, 0 with uncorrected ECC errors
        assert frame.gpu_health[i] in (1.0, 0.5, 0.0) and (frame.gpu_health[i] == 0.0) == (r.ecc_uncorrected > 0)

    snap = Refresher(src).tick()
    assert snap.topology is t and len(snap.frame.gpu_mem_free) == len(readings)
    assert (snap.frame.gpu_mem_free > 0).all() and (snap.frame.gpu_mem_free <= [r.mem_total for r in after]).all()
    assert np.isfinite(snap.gpu_health).all() and (snap.gpu_health <= snap.frame.gpu_health).all()


def test_refresher_ticks_within_budget_on_real_nvml(nvml: NvmlSource, tmp_path: Path) -> None:
    src, _ = _host_source(tmp_path, nvml)
    with Refresher(src, interval=0.2) as r:
        time.sleep(1.1)
    lat = r.latencies()
    assert not r.errors, list(r.errors)
    assert len(lat) >= 3 and max(lat) < 0.2, f"refresh latencies with NVML: {[round(x * 1e3, 1) for x in lat]} ms"


def test_placer_places_a_request_on_the_real_gpu(nvml: NvmlSource, tmp_path: Path) -> None:
    src, made_up_nic = _host_source(tmp_path, nvml)
    t = src.topology()
    readings = nvml.readings()
    slots = t.gpu_slots()
    cands = [Instance(id=f"recommender@{s.host}/{s.gpu}", model="recommender", deployment=s.to_deployment()) for s in slots]
    r = Refresher(src)
    r.tick()
    plan = Placer(r).place(cands, 0.2, contract())
    if not any(rd.gpu_class in GPU_CLASS_NAMES for rd in readings):  # e.g. a workstation GPU
        assert isinstance(plan, NoPlacement) and plan.binding is Constraint.GPU_CLASS, plan
        return
    assert isinstance(plan, PlacementPlan), f"refused on the real GPU: {plan}"
    assert plan.host == os.uname().nodename and plan.gpu_key in {f"{s.host}/{s.gpu}" for s in slots}
    chosen = readings[int(plan.gpu[3:])]
    assert plan.gpu_model == chosen.gpu_class == gpu_class(_direct(chosen.index)[0])
    slot = next(s for s in slots if s.gpu == plan.gpu)
    assert plan.numa_node == slot.numa_node and plan.cpus == next(n.cpus for n in t.numa if n.node == slot.numa_node)
    assert plan.rdma_port is not None and plan.rdma_port.startswith(f"{plan.host}/")
    if made_up_nic:
        assert plan.rdma_port == f"{plan.host}/eth0"
    assert 0 < plan.share <= 1 and 0 < plan.latency.total <= 0.2 and plan.latency.compute > 0
    assert not plan.stale and plan.reasons
