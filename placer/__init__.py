"""The placer: a live topology graph of the cluster and contract-aware GPU placement.

Public API (what the decision service and the guardian call):
- `SimulatedCluster(seed, hosts, gpus_per_host=8)`: the embedded telemetry source, with
  `gpu_slots()` and scripted events (`watermark`, `sm_collapse`, `link_down`,
  `service_p99`, `occupy`, `clear`) applied on the next tick;
- `LocalHostSource` (/sys) and `NvmlSource` (pynvml): real sources behind `TelemetrySource`;
- `Refresher(source, interval=0.2)`: the collector and the current `Snapshot`
  (`gpu_score(host, gpu)`, `score_changes(previous)`, `is_stale()`, `graph()`); before
  publishing a snapshot it builds the per-tick path tables (`paths.py`) placement reads.
  A refresh is a sequence of short steps, run on the refresher's own thread (`start()`)
  or paced on an asyncio event loop (`start(loop)`: the decision service's);
- `Placer(refresher).place(candidates, budget, contract, session=None, *, ingress=None,
  affinity_key=None)` -> `PlacementPlan | NoPlacement`, never raising; `report_anomaly`,
  `rebalance`. A plan's `reasons` and `rejected` are written on first read (`Explanation`)
  from the snapshot the choice was made on; a refusal's are written at once.

Placement is an O(candidates) gather from tables computed once per tick (`paths.py`), once
per contract (`contract_table.py`) and once per (tick, contract) (`tick_table.py`);
`evaluate.evaluate` is the reference it must equal figure for figure
(`tests/placer/test_lookup_tables.py`). Both run the same placement signals, one file each
under `signals/` (`framework.py` declares a signal; `docs/placement-signals.md` says how to
add one); the picker (hysteresis, stickiness, sessions) is `pick.py`. Measured state (the
model servers' own metrics, with ages) reaches the signals through `measured.py`. The fabric search (`fabric.search_many`) runs in
a columnar Bellman-Ford in numpy (fabric.py). Declared dependencies bind to fabric endpoints by kind and
proxy role (the simulator has redis, its proxies, postgres and http per region); a
dependency of kind `nvme` or `host_memory` is the session store on the GPU's own NUMA
node (`stores.py`), bound with role `local`.
"""

from __future__ import annotations

from .catalog import DEFAULT_CATALOG
from .events import Event, EventKind
from .localhost import LocalHostSource
from .nvml import NvmlSource
from .placer import Placer
from .plan import (
    Constraint, DependencyBinding, Explanation, LatencyBreakdown, NoPlacement, PlacementPlan, RebalanceReport,
    Rejection, SessionMove, ShareSource,
)
from .refresher import Refresher
from .simulator import SimulatedCluster
from .snapshot import Snapshot
from .telemetry import TelemetryFrame, TelemetrySource
from .thresholds import Thresholds
from .topology import GpuSlot, Topology

__all__ = [
    "DEFAULT_CATALOG", "Constraint", "DependencyBinding", "Event", "EventKind", "Explanation", "GpuSlot", "LatencyBreakdown",
    "LocalHostSource", "NoPlacement", "NvmlSource", "PlacementPlan", "Placer", "RebalanceReport", "Refresher",
    "Rejection", "SessionMove", "ShareSource", "SimulatedCluster", "Snapshot", "TelemetryFrame", "TelemetrySource",
    "Thresholds", "Topology",
]
