"""Evaluate a request's candidates by gathering their rows from the per-tick tables.

Everything that depends only on the snapshot (paths, ports, snapshot-only constraints,
service endpoints) or only on the contract (class, share, peak, session store), and what
depends on both (dependency bounds, `tick_table.py`), was computed once for all GPUs;
what is left per request is what truly varies per request:
the shares reserved so far this tick, the budget, and the gather itself. The result is
the same `Evaluation` the reference `evaluate` returns, figure for figure.
"""

from __future__ import annotations

import numpy as np

from .contract_table import ContractTable
from .evaluate import _CODE, Evaluation
from .latency import gpu_queue
from .paths import NO_FAILURE, path_table
from .plan import Constraint
from .snapshot import Snapshot
from .thresholds import Thresholds
from .tick_table import tick_table

_SHARE = _CODE[Constraint.GPU_SHARE]
_BUDGET = _CODE[Constraint.LATENCY_BUDGET]


def lookup(
    snap: Snapshot, th: Thresholds, gpus: np.ndarray, ingress: int | None, table: ContractTable, reserved: np.ndarray,
    budget: float,
) -> Evaluation:
    """`gpus`: topology indices of the candidates; `reserved`: share already reserved on
    each candidate's GPU this tick; `ingress`: fabric node, or None for regional gateways."""
    pt = path_table(snap, th, ingress)
    tt = tick_table(snap, pt, table)
    code = tt.code[gpus]
    min_share = table.min_share[gpus]
    free = snap.gpu_free[gpus] - reserved
    np.minimum(code, np.where(free < min_share, _SHARE, NO_FAILURE), out=code)
    share_used = np.minimum(np.maximum(np.maximum(free, min_share), 1e-6), 1.0)  # np.clip, without its overhead
    compute = table.flops / (table.peak_eff[gpus] * share_used)
    no_peak = table.no_peak[gpus]
    if no_peak.any():
        compute[no_peak] = np.inf
    queueing = gpu_queue(1.0 - free)
    network = pt.network[gpus]
    deps = tt.dependencies[gpus]
    dep_best = tuple((svc, eps, best[gpus], lat[gpus]) for svc, eps, best, lat in tt.services)

    total = network + queueing + compute + deps
    np.minimum(code, np.where(total <= budget * th.budget_fraction, NO_FAILURE, _BUDGET), out=code)
    fail = np.where(code == NO_FAILURE, -1, code)
    sigma = tt.sigma[gpus]
    return Evaluation(
        gpus=gpus, fail=fail, min_share=min_share, port=pt.port[gpus], network=network, queueing=queueing,
        compute=compute, dependencies=deps, sigma=sigma, rank=total + th.stability_weight * sigma,
        raw_total=pt.raw_network[gpus] + queueing + compute + deps, dep_best=dep_best,
    )
