"""Evaluate a request's candidates by gathering their rows from the per-tick tables.

Everything that depends only on the snapshot (paths, ports, snapshot-only constraints,
service endpoints) or only on the contract (class, share, peak, session store) was
computed once for all GPUs; what is left per request is what truly varies per request:
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

_SHARE = _CODE[Constraint.GPU_SHARE]
_DEPENDENCY = _CODE[Constraint.DEPENDENCY]
_BUDGET = _CODE[Constraint.LATENCY_BUDGET]


def lookup(
    snap: Snapshot, th: Thresholds, gpus: np.ndarray, ingress: int | None, table: ContractTable, reserved: np.ndarray,
    budget: float,
) -> Evaluation:
    """`gpus`: topology indices of the candidates; `reserved`: share already reserved on
    each candidate's GPU this tick; `ingress`: fabric node, or None for regional gateways."""
    pt = path_table(snap, th, ingress)
    code = np.minimum(pt.code[gpus], table.code[gpus])
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

    n = len(gpus)
    deps = np.zeros(n)
    dep_best = []
    for svc, role in table.services:
        dt = pt.dependency(snap, svc.kind, role)
        bi, bl = dt.best[gpus], dt.latency[gpus]
        if not dt.endpoints:
            code = np.minimum(code, _DEPENDENCY)
        else:
            np.minimum(code, np.where(bl > svc.p99, _DEPENDENCY, NO_FAILURE), out=code)
            deps = deps + np.where(np.isfinite(bl), bl, 0.0)
        dep_best.append((svc, dt.endpoints, bi, bl))  # a tuple, shared: never copied per request

    total = network + queueing + compute + deps
    sigma = np.sqrt(pt.sigma2[gpus])
    np.minimum(code, np.where(total <= budget * th.budget_fraction, NO_FAILURE, _BUDGET), out=code)
    fail = np.where(code == NO_FAILURE, -1, code)
    k = th.stability_weight
    return Evaluation(
        gpus=gpus, fail=fail, min_share=min_share, port=pt.port[gpus], network=network, queueing=queueing,
        compute=compute, dependencies=deps, sigma=sigma, rank=total + k * sigma,
        raw_total=pt.raw_network[gpus] + queueing + compute + deps, dep_best=tuple(dep_best),
    )
