"""GPU telemetry from NVML (pynvml, from the `nvidia-ml-py` distribution).

Where no NVIDIA GPU or driver exists, the source is still constructed: it reports no GPUs
and says so ("no NVIDIA GPU / NVML unavailable: <why>") instead of raising, so the same
service configuration runs on a laptop, in CI and on a GPU node.
"""

from __future__ import annotations

import os

from dataclasses import dataclass
from typing import Any

NVML_UNAVAILABLE = "no NVIDIA GPU / NVML unavailable"

# marketing name fragment -> catalog class (first match wins; order matters)
_CLASSES: tuple[tuple[str, str], ...] = (
    ("H200", "H200"), ("H100", "H100"), ("A100-SXM4-80GB", "A100-80G"), ("A100 80GB", "A100-80G"),
    ("A100-PCIE-80GB", "A100-80G"), ("A100", "A100-40G"), ("L40S", "L40S"), ("L4", "L4"),
)


def gpu_class(name: str) -> str:
    """Map an NVML device name ("NVIDIA H100 80GB HBM3") to a catalog class, or the name."""
    for frag, cls in _CLASSES:
        if frag in name:
            return cls
    return name


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    name: str
    gpu_class: str
    pci_bus_id: str
    numa_node: int
    sm_util: float  # fraction
    mem_free: float  # bytes
    mem_total: float
    sm_clock_ratio: float  # current / max SM clock (throttling shows here)
    pcie_util: float  # fraction of the link's bandwidth
    ecc_uncorrected: int
    health: float  # 1 healthy, lowered by uncorrected ECC errors and clock throttling


class NvmlSource:
    """Reads every NVIDIA GPU on this host; `available` and `reason` say whether it can."""

    name = "nvml"

    def __init__(self, sys_root: str = "/sys") -> None:
        self._sys = sys_root
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.available = False
        self.reason = ""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            self.available = n > 0
            self.reason = f"NVML: {n} GPU(s)" if n else f"{NVML_UNAVAILABLE}: NVML reports 0 devices"
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver not loaded, ...
            self.reason = f"{NVML_UNAVAILABLE}: {type(e).__name__}: {e}"

    def readings(self) -> tuple[GpuReading, ...]:
        """One reading per GPU; empty (never an error) when NVML is unavailable."""
        if not self.available:
            return ()
        out = []
        for i, h in enumerate(self._handles):
            try:
                out.append(self._read(i, h))
            except Exception as e:  # one failing GPU is a failed GPU, not a failed collector
                out.append(GpuReading(i, f"error: {type(e).__name__}", "unknown", "", 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0))
        return tuple(out)

    def cuda_version(self) -> str | None:
        """The CUDA version the driver supports ("12.8"), None where NVML does not say (the
        host's `cuda` fact, as its agent reads it too: `cluster/host_hardware.py`)."""
        if self._nvml is None:
            return None
        try:
            v = int(self._nvml.nvmlSystemGetCudaDriverVersion())
        except Exception:  # an old driver, or one that does not say
            return None
        return f"{v // 1000}.{v % 1000 // 10}"

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            finally:
                self._nvml, self.available = None, False

    def _read(self, i: int, h: Any) -> GpuReading:
        n = self._nvml
        name = n.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        util = n.nvmlDeviceGetUtilizationRates(h)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        bus = n.nvmlDeviceGetPciInfo(h).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        clock = _try(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), 0)
        max_clock = _try(lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM), 0)
        tx = _try(lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES), 0) * 1024.0  # KB/s
        rx = _try(lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES), 0) * 1024.0
        gen = _try(lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h), 4)
        width = _try(lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h), 16)
        link_bw = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.97e9, 5: 3.94e9, 6: 7.56e9}.get(gen, 1.97e9) * width
        ecc = _try(lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC), 0)
        ratio = clock / max_clock if max_clock else 1.0
        health = (0.0 if ecc > 0 else 1.0) * (0.5 if ratio < 0.5 and util.gpu > 50 else 1.0)
        return GpuReading(
            index=i, name=name, gpu_class=gpu_class(name), pci_bus_id=bus, numa_node=self._numa_of(bus),
            sm_util=util.gpu / 100.0, mem_free=float(mem.free), mem_total=float(mem.total), sm_clock_ratio=ratio,
            pcie_util=min(1.0, max(tx, rx) / link_bw), ecc_uncorrected=int(ecc), health=health,
        )

    def _numa_of(self, bus: str) -> int:
        # NVML's bus id has an 8-digit domain; sysfs uses 4 ("00000000:3B:00.0" -> "0000:3b:00.0")
        dom, _, rest = bus.partition(":")
        path = os.path.join(self._sys, "bus/pci/devices", f"{dom[-4:]}:{rest}".lower(), "numa_node")
        try:
            return max(0, int(open(path).read().strip()))
        except (OSError, ValueError):
            return 0


def _try(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception:  # not supported on this GPU / driver: report the default
        return default


