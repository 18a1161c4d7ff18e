"""Evaluate a request's candidates by gathering their rows from the per-tick tables.

Everything that depends only on the snapshot (paths, ports, snapshot-only constraints,
service endpoints) or only on the contract (class, share, peak, session store), and what
depends on both (dependency bounds, `tick_table.py`), was computed once for all GPUs;
what is left per request is what truly varies per request:
the shares reserved so far this tick, the budget, and the gather itself. The result is
the same `Evaluation` the reference `evaluate` returns, figure for figure.

Two ways to the same figures: up to `SCALAR_MAX` candidates, the rows are read as plain
Python tuples (`TickContractTable.rows`) and evaluated with Python floats, since for a
handful of candidates numpy's per-call overhead is most of the cost; above it, numpy
gathers. Python's float operations are the same IEEE-754 double operations numpy applies
element by element, done in the same order, and NaN is carried through minimum/maximum
as numpy does, so both ways give bit-identical results (the tests hold both to `evaluate`).
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from .contract_table import ContractTable
from .evaluate import _CODE, Evaluation
from .latency import GPU_QUANTUM, RHO_CAP, gpu_queue
from .paths import NO_FAILURE, path_table
from .plan import Constraint
from .snapshot import Snapshot
from .thresholds import Thresholds
from .tick_table import TickContractTable, tick_table

_SHARE = _CODE[Constraint.GPU_SHARE]
_BUDGET = _CODE[Constraint.LATENCY_BUDGET]
_PASS = int(NO_FAILURE)
_INF = float("inf")
SCALAR_MAX = 32  # candidate sets up to this size are evaluated with Python scalars


def lookup(
    snap: Snapshot, th: Thresholds, gpus: np.ndarray, ingress: int | None, table: ContractTable, reserved: np.ndarray,
    budget: float,
) -> Evaluation:
    """`gpus`: topology indices of the candidates; `reserved`: share already reserved on
    each candidate's GPU this tick; `ingress`: fabric node, or None for regional gateways."""
    pt = path_table(snap, th, ingress)
    tt = tick_table(snap, pt, table)
    if len(gpus) <= SCALAR_MAX:
        return _scalar_lookup(tt, th, gpus, table.flops, reserved, budget)
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


def _scalar_lookup(
    tt: TickContractTable, th: Thresholds, gpus: np.ndarray, flops: float, reserved: np.ndarray, budget: float,
) -> Evaluation:
    """The numpy path's arithmetic, candidate by candidate on Python floats, in the same
    order of operations; `a if a >= b or a != a else b` is np.maximum (NaN wins), and the
    same for np.minimum."""
    cols = tt.columns()
    rows = gpus.tolist()
    pick = itemgetter(*rows) if len(rows) > 1 else (lambda col: (col[rows[0]],) if rows else ())
    min_shares, networks, deps, sigmas = pick(cols.min_share), pick(cols.network), pick(cols.dependencies), pick(cols.sigma)
    limit = budget * th.budget_fraction
    k = th.stability_weight
    queueing_c: list[float] = []
    compute_c: list[float] = []
    rank_c: list[float] = []
    raw_c: list[float] = []
    fail_c: list[int] = []
    for code, min_share, peak_eff, no_peak, free, network, raw_network, dep, sigma, res in zip(
        pick(cols.code), min_shares, pick(cols.peak_eff), pick(cols.no_peak), pick(cols.free), networks,
        pick(cols.raw_network), deps, sigmas, reserved.tolist(),
    ):
        free = free - res
        if free < min_share and _SHARE < code:
            code = _SHARE
        share = free if free >= min_share or free != free else min_share
        share = share if share >= 1e-6 or share != share else 1e-6
        share = share if share <= 1.0 or share != share else 1.0
        if no_peak:
            compute = _INF
        else:
            denom = peak_eff * share
            compute = flops / denom if denom != 0.0 else float(np.float64(flops) / np.float64(denom))
        rho = 1.0 - free
        rho = rho if rho >= 0.0 or rho != rho else 0.0
        rho = rho if rho <= RHO_CAP or rho != rho else RHO_CAP
        queueing = GPU_QUANTUM * rho / (1.0 - rho)
        total = network + queueing + compute + dep
        if not total <= limit and _BUDGET < code:
            code = _BUDGET
        queueing_c.append(queueing)
        compute_c.append(compute)
        rank_c.append(total + k * sigma)
        raw_c.append(raw_network + queueing + compute + dep)
        fail_c.append(-1 if code == _PASS else code)
    # two conversions back to numpy for every field (each field a row, a view, of one block)
    svc = [(pick(best), pick(lat)) for best, lat in cols.services]
    f = np.array([min_shares, networks, queueing_c, compute_c, deps, sigmas, rank_c, raw_c, *(lat for _, lat in svc)],
                 dtype=np.float64)
    n = np.array([fail_c, pick(cols.port), *(best for best, _ in svc)], dtype=np.int64)
    dep_best = tuple((svc, eps, n[2 + i], f[8 + i]) for i, (svc, eps, _, _) in enumerate(tt.services))
    return Evaluation(
        gpus=gpus, fail=n[0], min_share=f[0], port=n[1], network=f[1], queueing=f[2], compute=f[3],
        dependencies=f[4], sigma=f[5], rank=f[6], raw_total=f[7], dep_best=dep_best,
    )
