"""Brute-force contract feasibility over the catalog: the reference Z3 is checked against.

With a subset of the clauses in force, a contract is feasible when some GPU class (one
of finitely many) admits it. Relaxed clauses take their most permissive value: FLOPs 0,
efficiency 100 %, no latency bound, no allowance, no bandwidth need, any architecture or
precision. Exact fractions, so verdicts on borderline cases match Z3's.
"""

from __future__ import annotations

from typing import Iterable

from .contract_clauses import Clause, ContractFacts


def feasible(f: ContractFacts, active: Iterable[Clause]) -> bool:
    on = set(active)
    if Clause.FLOPS in on and f.flops_lo > f.flops_hi:
        return False
    if Clause.LATENCY in on and Clause.ALLOWANCE in on and f.latency is not None and f.latency - f.allowance <= 0:
        return False
    if not f.gpus:
        return True
    for g in f.gpus:
        if Clause.ARCH in on and f.archs and g.arch not in f.archs:
            continue
        if Clause.PRECISION in on and not g.offers_precision:
            continue
        if Clause.BANDWIDTH in on and f.bandwidth > g.hbm:
            continue
        if Clause.LATENCY in on and f.latency is not None and Clause.FLOPS in on:
            eff = f.efficiency if Clause.EFFICIENCY in on else 1
            allowance = f.allowance if Clause.ALLOWANCE in on else 0
            budget = f.latency - allowance
            if budget <= 0 or f.flops_hi > g.peak * eff * budget:
                continue
        return True
    return False
