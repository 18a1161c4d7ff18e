"""Per-contract tables: what a contract alone rules out on each GPU of a topology.

The share a contract needs on a GPU class, whether the class is allowed at all, the
class's peak at the contract's precision and whether a NUMA node's session store suits
the contract depend only on the contract and the structure, not on the tick. The placer
builds one table per contract and keeps it while the topology and the catalog last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass, ServiceDependency
from policyc.compiler.meaning import compute_rate, request_flops

from .framework import EVERY, ContractInputs, Stage
from .paths import NO_FAILURE
from .shares import ShareBound, share_bounds
from .signals import CODE, of_stage
from .signals.dependency import PROXY_ROLE
from .topology import EndpointRole, Topology


@dataclass(frozen=True, eq=False)
class ContractTable:
    contract: Contract
    topology: Topology
    bounds: dict[str, ShareBound]  # per GPU class of the topology
    code: np.ndarray  # per GPU: the first contract-stage signal's code it fails (GPU class, session store), NO_FAILURE if none
    min_share: np.ndarray
    peak_eff: np.ndarray  # peak FLOP/s at the contract's precision x efficiency (1 x eff if unknown)
    no_peak: np.ndarray  # the class has no peak at this precision: compute is unbounded
    flops: float  # worst-case FLOPs of one request
    services: tuple[tuple[ServiceDependency, EndpointRole], ...]


def contract_table(contract: Contract, topology: Topology, catalog: Mapping[str, GpuClass]) -> ContractTable:
    """Build the table: the contract-stage signals' columns for every GPU (each signal's
    fast way: per GPU class, then gathered per GPU), and the prediction's per-GPU figures."""
    names, model_idx = topology.gpu_models
    bounds = share_bounds(contract, names, catalog)
    x = ContractInputs(topology, contract, catalog, bounds, EVERY)
    code = np.full(len(topology.gpus), NO_FAILURE, dtype=np.int64)
    for sig in of_stage(Stage.CONTRACT):
        col = sig.column(x)
        if col.fail is not None:
            np.minimum(code, np.where(col.fail, CODE[sig.constraint], NO_FAILURE), out=code)
    rated = [compute_rate(contract.compute, catalog[m]) if m in catalog else None for m in names]
    rates = np.array([np.nan if r is None else r for r in rated], dtype=np.float64)  # FLOP/s of a whole GPU
    min_share = np.array([bounds[m].min_share for m in names], dtype=np.float64)[model_idx]
    rate = rates[model_idx]
    no_peak = np.isnan(rate)
    arrays = (code, min_share, np.where(no_peak, contract.compute.efficiency, rate), no_peak)
    for a in arrays:
        a.setflags(write=False)
    return ContractTable(
        contract=contract, topology=topology, bounds=bounds,
        code=arrays[0], min_share=arrays[1], peak_eff=arrays[2], no_peak=arrays[3],
        flops=request_flops(contract.compute).hi,
        services=tuple((s, PROXY_ROLE[s.proxy]) for s in contract.dependencies.services),
    )
