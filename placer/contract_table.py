"""Per-contract tables: what a contract alone rules out on each GPU of a topology.

The share a contract needs on a GPU class, whether the class is allowed at all, the
class's peak at the contract's precision and whether a NUMA node's session store suits
the contract depend only on the contract and the structure, not on the tick. The placer
builds one table per contract (per budget too when the contract has no SLO, since the
budget then sets the share's window) and keeps it while the topology lasts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass, ServiceDependency

from .evaluate import PROXY_ROLE, _CODE
from .paths import NO_FAILURE
from .plan import Constraint
from .shares import ShareBound, share_bounds
from .topology import EndpointRole, Topology


@dataclass(frozen=True, eq=False)
class ContractTable:
    contract: Contract
    topology: Topology
    budget: float | None  # the budget the shares were computed for (None: the SLO sets them)
    bounds: dict[str, ShareBound]  # per GPU class of the topology
    code: np.ndarray  # per GPU: GPU_CLASS or SESSION_STORE code, NO_FAILURE if neither
    min_share: np.ndarray
    peak_eff: np.ndarray  # peak FLOP/s at the contract's precision x efficiency (1 x eff if unknown)
    no_peak: np.ndarray  # the class has no peak at this precision: compute is unbounded
    flops: float  # worst-case FLOPs of one request
    services: tuple[tuple[ServiceDependency, EndpointRole], ...]


def contract_table(contract: Contract, topology: Topology, catalog: Mapping[str, GpuClass], budget: float) -> ContractTable:
    """Build the table (vectorised over the topology's GPU classes, then gathered per GPU)."""
    names, model_idx = topology.gpu_models
    bounds = share_bounds(contract, names, catalog, budget)
    prec = contract.compute.precision
    peaks = np.array([(catalog[m].peak(prec) if m in catalog else None) or np.nan for m in names], dtype=np.float64)
    per_class_fail = np.array([not bounds[m].feasible for m in names], dtype=bool) | np.isnan(peaks)
    code = np.where(per_class_fail[model_idx], _CODE[Constraint.GPU_CLASS], NO_FAILURE).astype(np.int64)
    sess = contract.session
    if sess is not None and sess.state != "remote" and sess.colocate == "same_numa":
        code = np.minimum(code, np.where(topology.gpu_store != sess.state, _CODE[Constraint.SESSION_STORE], NO_FAILURE))
    min_share = np.array([bounds[m].min_share for m in names], dtype=np.float64)[model_idx]
    peak = peaks[model_idx]
    arrays = (code, min_share, np.nan_to_num(peak, nan=1.0) * contract.compute.efficiency, np.isnan(peak))
    for a in arrays:
        a.setflags(write=False)
    return ContractTable(
        contract=contract, topology=topology, budget=None if contract.slo is not None else budget, bounds=bounds,
        code=arrays[0], min_share=arrays[1], peak_eff=arrays[2], no_peak=arrays[3],
        flops=contract.compute.request_flops().hi,
        services=tuple((s, PROXY_ROLE[s.proxy]) for s in contract.dependencies.services),
    )
