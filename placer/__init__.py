"""The placer: a live topology graph of the cluster and contract-aware GPU placement.

Public API (what the decision service and the guardian call):
- `SimulatedCluster(seed, hosts, gpus_per_host=8)`: the embedded telemetry source, with
  `gpu_slots()` and scripted events (`watermark`, `sm_collapse`, `link_down`,
  `service_p99`, `occupy`, `clear`) applied on the next tick;
- `LocalHostSource` (/sys) and `NvmlSource` (pynvml): real sources behind `TelemetrySource`;
- `Refresher(source, interval=0.2)`: the collector thread and the current `Snapshot`
  (`gpu_score(host, gpu)`, `score_changes(previous)`, `is_stale()`, `graph()`);
- `Placer(refresher).place(candidates, budget, contract, session=None)` ->
  `PlacementPlan | NoPlacement`, never raising; `report_anomaly`, `rebalance`.
"""

from __future__ import annotations

from .catalog import DEFAULT_CATALOG
from .events import Event, EventKind
from .localhost import LocalHostSource
from .nvml import NvmlSource
from .placer import Placer
from .plan import (
    Constraint, DependencyBinding, LatencyBreakdown, NoPlacement, PlacementPlan, RebalanceReport, Rejection,
    SessionMove, ShareSource,
)
from .refresher import Refresher
from .simulator import SimulatedCluster
from .snapshot import Snapshot
from .telemetry import TelemetryFrame, TelemetrySource
from .thresholds import Thresholds
from .topology import GpuSlot, Topology

__all__ = [
    "DEFAULT_CATALOG", "Constraint", "DependencyBinding", "Event", "EventKind", "GpuSlot", "LatencyBreakdown",
    "LocalHostSource", "NoPlacement", "NvmlSource", "PlacementPlan", "Placer", "RebalanceReport", "Refresher",
    "Rejection", "SessionMove", "ShareSource", "SimulatedCluster", "Snapshot", "TelemetryFrame", "TelemetrySource",
    "Thresholds", "Topology",
]
