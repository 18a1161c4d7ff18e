"""Per tick and per contract: every GPU's figures that no request can change.

Within one tick, a contract's candidate on GPU g fails the same snapshot-only and
contract-only constraints, enters the fabric through the same port, pays the same round
trip, binds each declared service to the same endpoint at the same latency and fails
the same dependency bounds, whatever the request. Only the share reserved so far this
tick and the request's budget vary. Combining the path table (`paths.py`) and the
contract table (`contract_table.py`) once per (tick, contract), for all GPUs, leaves a
request a dozen gathers and the arithmetic that truly depends on it (`lookup.py`).

The arithmetic is the reference `evaluate`'s, in the same order of operations, so the
figures stay bit-identical (the tests compare them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .contract_table import ContractTable
from .evaluate import _CODE
from .paths import NO_FAILURE, PathTable
from .plan import Constraint
from .snapshot import Snapshot
from .topology import Endpoint

_DEPENDENCY = _CODE[Constraint.DEPENDENCY]


@dataclass(frozen=True, eq=False)
class TickContractTable:
    """Per GPU of the topology, for one (snapshot, thresholds, ingress, contract table)."""

    code: np.ndarray  # first static constraint failed (snapshot, contract, dependencies), NO_FAILURE if none
    sigma: np.ndarray  # sqrt of the path table's variance
    dependencies: np.ndarray  # seconds: the declared services' bound latencies, summed
    services: tuple[tuple[object, tuple[Endpoint, ...], np.ndarray, np.ndarray], ...]  # (service, endpoints, best, latency)


def tick_table(snap: Snapshot, pt: PathTable, table: ContractTable) -> TickContractTable:
    """The combined table, built once per tick and contract table, then shared by every
    request of the tick (a race builds it twice, identically)."""
    hit = pt.contracts.get(table)
    if hit is None:
        hit = pt.contracts[table] = _build(snap, pt, table)
    return hit


def _build(snap: Snapshot, pt: PathTable, table: ContractTable) -> TickContractTable:
    code = np.minimum(pt.code, table.code)
    n = len(code)
    deps = np.zeros(n)
    services = []
    for svc, role in table.services:
        dt = pt.dependency(snap, svc.kind, role)
        if not dt.endpoints:
            code = np.minimum(code, _DEPENDENCY)
        else:
            np.minimum(code, np.where(dt.latency > svc.p99, _DEPENDENCY, NO_FAILURE), out=code)
            deps = deps + np.where(np.isfinite(dt.latency), dt.latency, 0.0)
        services.append((svc, dt.endpoints, dt.best, dt.latency))
    sigma = np.sqrt(pt.sigma2)
    for a in (code, sigma, deps):
        a.setflags(write=False)
    return TickContractTable(code, sigma, deps, tuple(services))


__all__ = ["TickContractTable", "tick_table"]
