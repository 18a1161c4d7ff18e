"""Evaluate a request's candidates by gathering their rows from the per-tick tables.

Everything that depends only on the snapshot (paths, ports, snapshot-only constraints,
service endpoints) or only on the contract (class, share, peak, session store), and what
depends on both (dependency bounds, `tick_table.py`), was computed once for all GPUs;
what is left per request is what truly varies per request:
the shares reserved so far this tick, the budget, and the gather itself. The result is
the same `Evaluation` the reference `evaluate` returns, figure for figure.

Both ways start from one gather of the candidates' rows of the table's block
(`TickContractTable.block`). Up to `SCALAR_MAX` candidates, those rows become Python lists
(one `tolist`) and are evaluated with Python floats, since for a handful of candidates
numpy's per-call overhead is most of the cost; above it, numpy works on the gathered
columns. Python's float operations are the same IEEE-754 double operations numpy applies
element by element, done in the same order, and NaN is carried through minimum/maximum
as numpy does, so both ways give bit-identical results (the tests hold both to `evaluate`).
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple, Sequence

import numpy as np

from policyc.compiler.meaning import MIN_SHARE as LEAST_SHARE, compute_seconds

from .contract_table import ContractTable
from .evaluate import Evaluation
from .latency import GPU_QUANTUM, RHO_CAP, gpu_queue
from .paths import NO_FAILURE, path_table
from .plan import Constraint
from .signals import CODE, gpu_share, latency_budget
from .snapshot import Snapshot
from .thresholds import Thresholds
from .tick_table import (
    DEPENDENCIES, FREE, MIN_SHARE, NETWORK, NO_PEAK, PEAK_EFF, RAW_NETWORK, SIGMA, WAIT, Layout, TickContractTable,
    tick_table,
)

# the request-stage signals (share, budget): the one part of evaluation a request's own
# figures decide, so the runners' own arithmetic (the signals' vectorised filters below;
# `scalar_rows` unrolls them candidate by candidate)
_SHARE = CODE[Constraint.GPU_SHARE]
_BUDGET = CODE[Constraint.LATENCY_BUDGET]
_PASS = int(NO_FAILURE)
_INF = float("inf")
SCALAR_MAX = 32  # candidate sets up to this size are evaluated with Python scalars


def lookup(
    snap: Snapshot, th: Thresholds, gpus: np.ndarray, ingress: int | None, table: ContractTable, reserved: np.ndarray,
    budget: float, priced: tuple[np.ndarray, float] | None = None,
) -> Evaluation:
    """`gpus`: topology indices of the candidates; `reserved`: share already reserved on
    each candidate's GPU this tick; `ingress`: fabric node, or None for regional gateways;
    `priced`: an LLM request's own (share per candidate, FLOPs) in place of the contract's
    constant ones (`llm_price.py`), evaluated by numpy on the gather (a copy of the rows)."""
    pt = path_table(snap, th, ingress)
    tt = tick_table(snap, pt, table)
    g = tt.block[gpus]
    flops = table.flops
    if priced is not None:
        g[:, MIN_SHARE], flops = priced
    elif len(gpus) <= SCALAR_MAX:
        figures = scalar_figures(tt.layout, g.tolist(), reserved.tolist(), table.flops, budget * th.budget_fraction,
                                 th.stability_weight)
        return scalar_evaluation(tt, g, gpus, figures)
    lay = tt.layout
    ints = g[:, lay.code:].astype(np.int64)  # code, port, best endpoint per service
    min_share = g[:, MIN_SHARE]
    free = g[:, FREE] - reserved
    code = np.minimum(ints[:, 0], np.where(gpu_share.refuses(free, min_share), _SHARE, NO_FAILURE))
    share_used = np.minimum(np.maximum(np.maximum(free, min_share), LEAST_SHARE), 1.0)  # np.clip, without its overhead
    compute = compute_seconds(flops, g[:, PEAK_EFF], share_used)
    no_peak = g[:, NO_PEAK] != 0.0
    if no_peak.any():
        compute[no_peak] = np.inf
    queueing = gpu_queue(1.0 - free) + g[:, WAIT]
    network = g[:, NETWORK]
    deps = g[:, DEPENDENCIES]
    dep_best = tuple((svc, eps, ints[:, lay.best(i) - lay.code], g[:, lay.latency(i)])
                     for i, (svc, eps, _, _) in enumerate(tt.services))

    total = network + queueing + compute + deps
    np.minimum(code, np.where(latency_budget.refuses(total, budget * th.budget_fraction), _BUDGET, NO_FAILURE), out=code)
    fail = np.where(code == NO_FAILURE, -1, code)
    sigma = g[:, SIGMA]
    return Evaluation(
        gpus=gpus, fail=fail, min_share=min_share, port=ints[:, 1], network=network, queueing=queueing,
        compute=compute, dependencies=deps, sigma=sigma, rank=total + th.stability_weight * sigma,
        raw_total=g[:, RAW_NETWORK] + queueing + compute + deps, dep_best=dep_best,
    )


_Row = tuple[float, float, float, float, int]  # one candidate's (queueing, compute, rank, raw_total, fail)
_FIELDS: dict[int, itemgetter] = {}  # a layout's first integer column -> the getter of a row's fields


class Figures(NamedTuple):
    """What the scalar path computes per candidate, aligned with the rows."""

    queueing: tuple[float, ...]
    compute: tuple[float, ...]
    rank: tuple[float, ...]
    raw_total: tuple[float, ...]
    fail: tuple[int, ...]  # index into ORDER, -1 when feasible


def scalar_figures(
    layout: Layout, rows: Sequence[Sequence[float]], reserved: Sequence[float], flops: float, limit: float, k: float,
    memo: list[tuple[float, float, _Row, _Row] | None] | None = None,
) -> Figures:
    """`scalar_rows` as columns."""
    return figures_of(scalar_rows(layout, rows, reserved, flops, limit, k, memo))


def figures_of(outs: list[_Row]) -> Figures:
    """Per-candidate rows (`scalar_rows`) as columns."""
    if not outs:
        return Figures((), (), (), (), ())
    return Figures(*zip(*outs))


def scalar_rows(
    layout: Layout, rows: Sequence[Sequence[float]], reserved: Sequence[float], flops: float, limit: float, k: float,
    memo: list[tuple[float, float, _Row, _Row] | None] | None = None,
) -> list[_Row]:
    """Per candidate, (queueing, compute, rank, raw total, failed constraint or -1): the numpy path's arithmetic, candidate by candidate on Python floats, in the same
    order of operations; `a if a >= b or a != a else b` is np.maximum (NaN wins), and the
    same for np.minimum. `rows`: the candidates' rows of a tick table's block (`tolist`);
    `reserved`: the share reserved on each one's GPU this tick; `limit`: the budget share
    a prediction must stay within; `k`: the stability weight.

    `memo` (one slot per row) keeps each row's latest figures, with the share reserved
    they were worked out for, for one tick table (whose rows, flops and k are fixed): a
    placement reserves share on one GPU, so the next request of the same candidates
    recomputes one row and reads the others. The budget enters only the last comparison,
    so a slot holds the row's predicted total and its figures both ways (within the
    budget, and over it): requests with different latency targets (a diverse mix draws one
    per request) share the memo too. Reservations only grow within a tick, so an older
    reservation's figures are never asked for again and are not kept."""
    fields = _FIELDS.get(layout.code)
    if fields is None:
        fields = _FIELDS[layout.code] = itemgetter(MIN_SHARE, PEAK_EFF, NO_PEAK, FREE, NETWORK, RAW_NETWORK, DEPENDENCIES,
                                                   SIGMA, WAIT, layout.code)
    outs: list[_Row] = []
    append = outs.append
    slots: list[tuple[float, float, _Row, _Row] | None] = memo if memo is not None else [None] * len(rows)  # (this call's)
    for i, (row, res) in enumerate(zip(rows, reserved)):
        hit = slots[i]
        if hit is None or hit[0] != res:
            min_share, peak_eff, no_peak, free, network, raw_network, dep, sigma, wait, code = fields(row)
            free = free - res
            if free < min_share and _SHARE < code:
                code = _SHARE
            share = free if free >= min_share or free != free else min_share
            share = share if share >= LEAST_SHARE or share != share else LEAST_SHARE
            share = share if share <= 1.0 or share != share else 1.0
            if no_peak:
                compute = _INF
            else:
                compute = compute_seconds(flops, peak_eff, share) if peak_eff * share != 0.0 else \
                    float(np.float64(flops) / np.float64(peak_eff * share))  # numpy's inf or nan
            rho = 1.0 - free
            rho = rho if rho >= 0.0 or rho != rho else 0.0
            rho = rho if rho <= RHO_CAP or rho != rho else RHO_CAP
            queueing = GPU_QUANTUM * rho / (1.0 - rho) + wait
            total = network + queueing + compute + dep
            rank, raw = total + k * sigma, raw_network + queueing + compute + dep
            over = _BUDGET if _BUDGET < code else code
            hit = (res, total, (queueing, compute, rank, raw, -1 if code == _PASS else int(code)),
                   (queueing, compute, rank, raw, -1 if over == _PASS else int(over)))
            slots[i] = hit
        append(hit[2] if hit[1] <= limit else hit[3])  # `not total <= limit`: over (NaN too)
    return outs


def scalar_evaluation(tt: TickContractTable, g: np.ndarray, gpus: np.ndarray, f: Figures) -> Evaluation:
    """The `Evaluation` of the scalar path's figures: the computed lists as arrays, the
    rest views of the gather `g` (the candidates' rows of the block)."""
    lay = tt.layout
    ints = g[:, lay.port:].astype(np.int64)  # port, best endpoint per service
    dep_best = tuple((svc, eps, ints[:, lay.best(i) - lay.port], g[:, lay.latency(i)])
                     for i, (svc, eps, _, _) in enumerate(tt.services))
    return Evaluation(
        gpus=gpus, fail=np.array(f.fail, dtype=np.int64), min_share=g[:, MIN_SHARE], port=ints[:, 0],
        network=g[:, NETWORK], queueing=np.array(f.queueing, dtype=np.float64),
        compute=np.array(f.compute, dtype=np.float64), dependencies=g[:, DEPENDENCIES], sigma=g[:, SIGMA],
        rank=np.array(f.rank, dtype=np.float64), raw_total=np.array(f.raw_total, dtype=np.float64), dep_best=dep_best,
    )
