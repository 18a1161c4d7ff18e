"""What a telemetry source reports each tick, and the one interface every source offers.

A frame holds arrays aligned with its topology's index order (GPU i of the frame is GPU i
of the topology), so building a snapshot of 8,000 GPUs is a handful of numpy operations
instead of 8,000 dictionary updates. Fractions are in [0, 1]; times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from .readings import NO_READINGS, Readings
from .topology import Topology


@dataclass(frozen=True, eq=False)
class TelemetryFrame:
    tick: int
    gpu_sm_util: np.ndarray  # fraction of SM time busy
    gpu_demand: np.ndarray  # fraction of the GPU allocated to running work (NaN: unknown)
    gpu_mem_free: np.ndarray  # bytes
    gpu_pcie_util: np.ndarray  # fraction of PCIe link bandwidth in use
    gpu_health: np.ndarray  # 1 healthy .. 0 failed (ECC, XID, throttling)
    port_watermark: np.ndarray  # buffer occupancy fraction
    port_util: np.ndarray  # bandwidth utilisation fraction
    port_up: np.ndarray  # bool
    link_util: np.ndarray  # per fabric link
    link_up: np.ndarray  # bool per fabric link
    switch_watermark: np.ndarray  # per fabric node (0 for non-switches)
    endpoint_p99: np.ndarray  # seconds, per service endpoint
    numa_mem_free: np.ndarray  # bytes per NUMA node
    notes: tuple[str, ...] = ()  # what the source could not see, in words
    measured: Readings = field(default_factory=lambda: NO_READINGS)  # the model servers' own readings per GPU key, with their ages (`readings.py`)

    @staticmethod
    def empty(topology: Topology, tick: int = 0, notes: tuple[str, ...] = ()) -> "TelemetryFrame":
        """An all-idle, all-healthy frame: the starting point sources fill in."""
        g, p, l, f, e, n = (len(topology.gpus), len(topology.ports), len(topology.links),
                            len(topology.fabric_nodes), len(topology.endpoints), len(topology.numa))
        return TelemetryFrame(
            tick=tick, gpu_sm_util=np.zeros(g), gpu_demand=np.full(g, np.nan), gpu_mem_free=np.zeros(g),
            gpu_pcie_util=np.zeros(g), gpu_health=np.ones(g), port_watermark=np.zeros(p),
            port_util=np.zeros(p), port_up=np.ones(p, dtype=bool), link_util=np.zeros(l),
            link_up=np.ones(l, dtype=bool), switch_watermark=np.zeros(f), endpoint_p99=np.zeros(e),
            numa_mem_free=np.zeros(n), notes=notes,
        )


@runtime_checkable
class TelemetrySource(Protocol):
    """A source of cluster structure and per-tick readings.

    `topology()` may return a new version when the structure changes (a link's removal is
    telemetry, not structure). `sample()` must not block for long: the refresher calls it
    every tick and measures it.
    """

    name: str

    def topology(self) -> Topology: ...

    def sample(self) -> TelemetryFrame: ...
