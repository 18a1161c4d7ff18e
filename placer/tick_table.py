"""Per tick and per contract: every GPU's figures that no request can change.

Within one tick, a contract's candidate on GPU g fails the same snapshot-only and
contract-only constraints, enters the fabric through the same port, pays the same round
trip, binds each declared service to the same endpoint at the same latency and fails
the same dependency bounds, whatever the request. Only the share reserved so far this
tick and the request's budget vary. Combining the path table (`paths.py`) and the
contract table (`contract_table.py`) once per (tick, contract), for all GPUs, leaves a
request one gather and the arithmetic that truly depends on it (`lookup.py`).

A request gathers its candidates' rows from one block (`block`): every per-GPU figure of
the table side by side in a float64 array, one row per GPU, built with the table. One
fancy index brings a candidate's figures together in one contiguous row (instead of a
dozen gathers, or a dozen lookups in per-column Python lists whose float objects lie
scattered in memory), and `tolist` turns a handful of rows into Python floats for the
scalar path. Integer columns (constraint code, port, best endpoint) are small integers,
exact in a float64, and booleans are 0.0 / 1.0.

The arithmetic is the reference `evaluate`'s, in the same order of operations, so the
figures stay bit-identical (the tests compare them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from policyc.compiler.bundle import ServiceDependency

from .contract_table import ContractTable
from .framework import Stage, TickContractInputs
from .paths import NO_FAILURE, PathTable
from .signals import CODE, of_stage
from .snapshot import Snapshot
from .topology import Endpoint


# the block's leading columns, in this order; then each declared service's latency, then the
# integer columns: the constraint code, the port, and each declared service's best endpoint.
# These are the prediction's figures, not one column per signal: a signal's refusals fold into
# the code, its seconds into `wait` (the tick's signals, added to the queueing) or
# `dependencies` (the tick-and-contract ones), so a new signal changes no layout.
_TICK_CONTRACT = of_stage(Stage.TICK_CONTRACT)
BLOCK_FLOATS = ("min_share", "peak_eff", "no_peak", "free", "network", "raw_network", "dependencies", "sigma", "wait")
(MIN_SHARE, PEAK_EFF, NO_PEAK, FREE, NETWORK, RAW_NETWORK, DEPENDENCIES, SIGMA, WAIT) = range(len(BLOCK_FLOATS))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a table's columns lie in its block, for `services` declared services."""

    services: int

    @property
    def code(self) -> int:
        return len(BLOCK_FLOATS) + self.services  # the first integer column

    @property
    def port(self) -> int:
        return self.code + 1

    def latency(self, i: int) -> int:
        return len(BLOCK_FLOATS) + i

    def best(self, i: int) -> int:
        return self.code + 2 + i

    @property
    def width(self) -> int:
        return self.code + 2 + self.services


@dataclass(frozen=True, eq=False)
class TickContractTable:
    """Per GPU of the topology, for one (snapshot, thresholds, ingress, contract table)."""

    code: np.ndarray  # first static constraint failed (snapshot, contract, dependencies), NO_FAILURE if none
    sigma: np.ndarray  # sqrt of the path table's variance
    dependencies: np.ndarray  # seconds: the declared services' bound latencies, summed
    services: tuple[tuple[ServiceDependency, tuple[Endpoint, ...], np.ndarray, np.ndarray], ...]  # (service, endpoints, best, latency)
    snap_free: np.ndarray  # the snapshot's free share per GPU (the same array the reference reads)
    min_share: np.ndarray  # the contract table's, per GPU
    peak_eff: np.ndarray
    no_peak: np.ndarray
    network: np.ndarray  # the path table's, per GPU
    raw_network: np.ndarray
    port: np.ndarray
    block: np.ndarray  # GPUs x columns: the figures above side by side (see `Layout`)
    layout: Layout


def tick_table(snap: Snapshot, pt: PathTable, table: ContractTable) -> TickContractTable:
    """The combined table for a request, built once per tick and contract table, then
    shared by every request of the tick (a race builds it twice, identically). Marked
    used, so the next tick warms it."""
    pt.used_contracts.add(table)
    return _combined(snap, pt, table)


def _combined(snap: Snapshot, pt: PathTable, table: ContractTable) -> TickContractTable:
    hit = pt.contracts.get(table)
    if hit is None:
        hit = pt.contracts[table] = _build(snap, pt, table)
    return hit


def warm_contract_steps(snap: Snapshot, previous: Snapshot | None) -> Iterator[str]:
    """Build, ahead of the first request, the per-contract tables the previous snapshot's
    requests read (its path tables' `used_contracts`), on this snapshot's path tables
    (which `paths.warm_steps` built first), one table per step (yields the step's kind after each).
    Without it the first request of each tick and contract builds its table (~0.5 ms at
    8,000 GPUs) inside its own decision."""
    if previous is None or previous.topology is not snap.topology:
        return
    for key, old in list(previous.tables.items()):
        pt = snap.tables.get(key)
        if pt is None:
            continue  # `paths.warm_steps` skipped it (its ingress is gone, or no request read it)
        for table in tuple(old.used_contracts):  # a copy: requests may still be adding to it
            if table.topology is snap.topology and table not in pt.contracts:
                _combined(snap, pt, table)
                yield "contract table"


def _build(snap: Snapshot, pt: PathTable, table: ContractTable) -> TickContractTable:
    code = np.minimum(pt.code, table.code)
    n = len(code)
    deps: np.ndarray | None = None
    services: list = []
    for sig in _TICK_CONTRACT:
        col = sig.column(TickContractInputs(snap, table.contract, table=pt))
        if col.fail is not None:
            np.minimum(code, np.where(col.fail, CODE[sig.constraint], NO_FAILURE), out=code)
        if col.latency is not None:
            deps = col.latency if deps is None else deps + col.latency
        services.extend(col.extra)
    if deps is None:
        deps = np.zeros(n)
    sigma = np.sqrt(pt.sigma2)
    for a in (code, sigma, deps):
        a.setflags(write=False)
    layout = Layout(len(services))
    cols = (table.min_share, table.peak_eff, table.no_peak, snap.gpu_free, pt.network, pt.raw_network, deps, sigma, pt.wait,
            *(lat for _, _, _, lat in services), code, pt.port, *(best for _, _, best, _ in services))
    block = np.empty((n, layout.width))
    for j, a in enumerate(cols):
        block[:, j] = a
    block.setflags(write=False)
    return TickContractTable(code, sigma, deps, tuple(services), snap.gpu_free, table.min_share, table.peak_eff,
                             table.no_peak, pt.network, pt.raw_network, pt.port, block, layout)


__all__ = ["BLOCK_FLOATS", "Layout", "TickContractTable", "tick_table", "warm_contract_steps"]
