"""GPU time per process from NVML: the driver's per-process utilisation samples.

`nvmlDeviceGetProcessUtilization(device, last_seen)` returns, for every process that used
the GPU since `last_seen`, samples of its SM utilisation (percent of the GPU's time) stamped
in microseconds. A process's GPU-seconds over the time between two of its samples is its SM
utilisation times that time; summed, a cumulative GPU time per process that the driver, not
the model server, measured. `audit/cgroup_cpu.py` keeps it per serving process's cgroup and
apportions it to calls with the same rule as CPU time.

NVML without this call (`NOT_SUPPORTED`), no driver, or no GPU: `open_nvml` returns None and
nothing is figured (the record says GPU time is absent, never estimated here).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("policyc.audit.nvml_process")

METHOD = "nvml: nvmlDeviceGetProcessUtilization SM samples of the serving process (util % x time between samples)"


class NvmlProcessGpu:
    """Cumulative GPU-seconds per pid, from every device's process utilisation samples."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._last_seen = [0] * len(handles)
        self._previous: dict[tuple[int, int], int] = {}  # (device, pid) -> its last sample's time stamp (us)
        self.gpu_seconds: dict[int, float] = {}  # pid -> GPU-seconds so far (every device)

    def poll(self) -> None:
        """Read the samples since the last poll into `gpu_seconds`."""
        nvml = self._nvml
        for i, h in enumerate(self._handles):
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(h, self._last_seen[i])
            except nvml.NVMLError:
                continue  # NOT_FOUND: no process used this GPU since the last poll
            for s in samples:
                pid, stamp = int(s.pid), int(s.timeStamp)
                self._last_seen[i] = max(self._last_seen[i], stamp)
                before = self._previous.get((i, pid))
                self._previous[(i, pid)] = stamp
                if before is not None and stamp > before:
                    self.gpu_seconds[pid] = self.gpu_seconds.get(pid, 0.0) + min(int(s.smUtil), 100) / 100 * (stamp - before) / 1e6

    def forget(self, live: set[int]) -> None:
        """Drop the processes not in `live` (ended servers), so the tables stay bounded."""
        for pid in [p for p in self.gpu_seconds if p not in live]:
            del self.gpu_seconds[pid]
        for key in [k for k in self._previous if k[1] not in live]:
            del self._previous[key]


def open_nvml() -> NvmlProcessGpu | None:
    """NVML's per-process sampler over every GPU here, or None (no driver, no GPU, no support)."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError or fails to load the library: no GPU figures
        return None
    if not handles:
        return None
    sampler = NvmlProcessGpu(pynvml, handles)
    try:
        sampler.poll()
    except AttributeError:  # a pynvml without the call
        return None
    log.info("GPU time per process from NVML on %d GPU(s)", len(handles))
    return sampler
