"""Per tick and per contract: every GPU's figures that no request can change.

Within one tick, a contract's candidate on GPU g fails the same snapshot-only and
contract-only constraints, enters the fabric through the same port, pays the same round
trip, binds each declared service to the same endpoint at the same latency and fails
the same dependency bounds, whatever the request. Only the share reserved so far this
tick and the request's budget vary. Combining the path table (`paths.py`) and the
contract table (`contract_table.py`) once per (tick, contract), for all GPUs, leaves a
request a dozen gathers and the arithmetic that truly depends on it (`lookup.py`).

A request with a handful of candidates (the decision path asks for ~8) pays more for
numpy's per-call overhead (1-3 µs a call, ~25 calls) than for the arithmetic itself, so the
table also keeps, built on the first such request of the tick, each per-GPU column as a
plain Python list (`Columns`): the lookup then picks its candidates' entries, does a few
dozen float operations, and only the result goes back to numpy.

The arithmetic is the reference `evaluate`'s, in the same order of operations, so the
figures stay bit-identical (the tests compare them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

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
    snap_free: np.ndarray  # the snapshot's free share per GPU (the same array the reference reads)
    min_share: np.ndarray  # the contract table's, per GPU
    peak_eff: np.ndarray
    no_peak: np.ndarray
    network: np.ndarray  # the path table's, per GPU
    raw_network: np.ndarray
    port: np.ndarray
    # the same figures as Python lists, one per column: built on the first small request (`columns`)
    _cache: dict = field(default_factory=dict, repr=False)

    def columns(self) -> Columns:
        """Every per-GPU column as a plain Python list (built once per tick and contract
        table: a dozen `tolist` calls, ~1 ms for 8,000 GPUs, and no per-GPU containers,
        which would wake the garbage collector; a race builds it twice, identically)."""
        cols = self._cache.get("columns")
        if cols is None:
            cols = self._cache["columns"] = Columns(
                *(a.tolist() for a in (self.code, self.min_share, self.peak_eff, self.no_peak, self.snap_free,
                                       self.network, self.raw_network, self.port, self.dependencies, self.sigma)),
                services=tuple((best.tolist(), lat.tolist()) for _, _, best, lat in self.services),
            )
        return cols


class Columns(NamedTuple):
    """A tick table's per-GPU columns as Python lists of floats, ints and bools."""

    code: list[int]
    min_share: list[float]
    peak_eff: list[float]
    no_peak: list[bool]
    free: list[float]
    network: list[float]
    raw_network: list[float]
    port: list[int]
    dependencies: list[float]
    sigma: list[float]
    services: tuple[tuple[list[int], list[float]], ...]  # per declared service: (best endpoint, its latency)


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
    return TickContractTable(code, sigma, deps, tuple(services), snap.gpu_free, table.min_share, table.peak_eff,
                             table.no_peak, pt.network, pt.raw_network, pt.port)


__all__ = ["Columns", "TickContractTable", "tick_table"]
