"""The reference runner: evaluate a request's candidate GPUs against one snapshot, all at
once, by running every registered signal (`signals/`) over the candidates.

For each candidate: the share the solver requires, each signal's refusal and seconds
(health, free share, PCIe, session store, both host-local paths finished onto the fabric
distances the refresher precomputed, each declared dependency bound to its best endpoint,
the measured queue), and the predicted latency with its spread. Every candidate keeps the
*first* constraint it failed, in the registry's order (`ORDER`), so a refusal can name what
bound.

This is the reference: the placer itself gathers the same figures from per-tick tables,
which run the same signals' columns once per tick (`contract_table.py`, `paths.py`,
`tick_table.py`, `lookup.py`), and the tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass
from policyc.compiler.meaning import MIN_SHARE, compute_seconds, request_flops

from .framework import Column, ContractInputs, RequestInputs, Stage, TickContractInputs, TickInputs
from .latency import gpu_queue
from .plan import Constraint, DependencyBinding
from .port_paths import PortPaths, best_ports
from .shares import ShareBound
from .signals import ORDER, SIGNALS
from .signals.dependency import PROXY_ROLE, binding, problem
from .snapshot import Snapshot
from .thresholds import Thresholds


@dataclass(frozen=True, eq=False)
class Evaluation:
    gpus: np.ndarray  # topology GPU index per row
    fail: np.ndarray  # index into ORDER, -1 when feasible
    min_share: np.ndarray
    port: np.ndarray  # chosen port per row (-1: none)
    network: np.ndarray
    queueing: np.ndarray
    compute: np.ndarray
    dependencies: np.ndarray
    sigma: np.ndarray
    rank: np.ndarray  # predicted + k * sigma: lower is better
    raw_total: np.ndarray  # prediction ignoring port thresholds (for explaining refusals)
    dep_best: tuple[tuple, ...]  # per declared service: (service, endpoints, best endpoint per row, its latency)

    @property
    def total(self) -> np.ndarray:
        return self.network + self.queueing + self.compute + self.dependencies

    def bindings(self, row: int) -> tuple[DependencyBinding, ...]:
        """The endpoint each declared service binds to for this row (feasible ones only)."""
        out = (binding(svc, eps, int(bi[row]), float(bl[row])) for svc, eps, bi, bl in self.dep_best)
        return tuple(b for b in out if b is not None)

    def dependency_problem(self, row: int) -> str:
        """Why this row's first failing dependency fails ("" when none does)."""
        return problem(self.dep_best, row)

    def failed(self, row: int) -> Constraint | None:
        code = int(self.fail[row])
        return None if code < 0 else ORDER[code]

    def constraint(self, row: int) -> Constraint:
        """The constraint a row failed; ValueError for a feasible row."""
        c = self.failed(row)
        if c is None:
            raise ValueError(f"row {row} is feasible: it failed no constraint")
        return c


def evaluate(
    snap: Snapshot, th: Thresholds, gpus: np.ndarray, bounds: dict[str, ShareBound], catalog: dict[str, GpuClass],
    contract: Contract, budget: float, ingress_rows: np.ndarray, reserved: np.ndarray,
) -> Evaluation:
    t = snap.topology
    n = len(gpus)
    cx = ContractInputs(t, contract, catalog, bounds, gpus)
    tx = TickInputs(snap, th, gpus, ingress_rows)
    cols: list[Column | None] = [None] * len(SIGNALS)  # per signal, in ORDER (the request's come last)
    wait: np.ndarray | None = None  # seconds the tick's signals add to the queueing
    deps, dep_best = np.zeros(n), ()
    for i, s in enumerate(SIGNALS):
        if s.stage is Stage.CONTRACT:
            cols[i] = s.reference(cx)
        elif s.stage is Stage.TICK:
            col = cols[i] = s.reference(tx)
            if col.latency is not None:
                wait = col.latency if wait is None else wait + col.latency
        elif s.stage is Stage.TICK_CONTRACT:
            col = cols[i] = s.reference(TickContractInputs(snap, contract, tick=tx))
            if col.latency is not None:
                deps = deps + col.latency
            dep_best = dep_best + col.extra

    # the prediction: the share the contract needs, the compute it takes on it, the queue
    models = [t.gpus[i].model for i in gpus.tolist()]
    min_share = np.array([bounds[m].min_share for m in models], dtype=np.float64)
    prec = contract.compute.precision
    peaks = {m: (catalog[m].peak(prec) if m in catalog else None) for m in set(models)}
    peak = np.array([peaks[m] or np.nan for m in models], dtype=np.float64)
    free = snap.gpu_free[gpus] - reserved
    share_used = np.clip(np.maximum(free, min_share), MIN_SHARE, 1.0)
    flops = request_flops(contract.compute).hi
    compute = np.where(np.isnan(peak), np.inf,
                       compute_seconds(flops, np.nan_to_num(peak, nan=1.0) * contract.compute.efficiency, share_used))
    queueing = gpu_queue(1.0 - free)
    if wait is not None:
        queueing = queueing + wait
    k = th.stability_weight
    paths = tx.paths
    total = paths.net + queueing + compute + deps
    sigma = np.sqrt(paths.var + snap.gpu_sigma[gpus] ** 2)

    rx = RequestInputs(free, min_share, total, budget * th.budget_fraction)
    fail = np.full(n, -1, dtype=np.int64)
    for i, s in enumerate(SIGNALS):
        got = cols[i] if s.stage is not Stage.REQUEST else s.reference(rx)
        if got is not None and got.fail is not None:
            fail[(fail < 0) & got.fail] = i
    return Evaluation(
        gpus=gpus, fail=fail, min_share=min_share, port=paths.port, network=paths.net, queueing=queueing,
        compute=compute, dependencies=deps, sigma=sigma, rank=total + k * sigma,
        raw_total=paths.raw_net + queueing + compute + deps, dep_best=tuple(dep_best),
    )


__all__ = ["ORDER", "PROXY_ROLE", "Evaluation", "PortPaths", "best_ports", "binding", "evaluate"]
