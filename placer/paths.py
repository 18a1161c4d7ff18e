"""Per-tick path tables: every GPU's best way from an ingress, computed once per snapshot.

A snapshot is immutable for its whole tick, so everything a placement derives from it
alone (which host-local port a GPU would use, the round trip through it, the path's
variance, which snapshot-only constraint a GPU already fails, and the best endpoint for
each declared service kind, or the session store on its NUMA node) is the same for every request of that tick. Computing it for
all GPUs at once (a few numpy passes over 8,000 entries) and letting each request gather
its candidates' rows turns placement into an O(candidates) lookup. The refresher warms
the tables the previous tick used before it publishes a snapshot, so requests rarely pay
for building one; a table that is missing is built on first use and kept.

The arithmetic here is the reference `evaluate` applied to every GPU, in the same order
of operations, so a lookup gives bit-identical figures (the tests compare them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Iterator

import numpy as np

from .framework import EVERY, Signal, Stage, TickInputs
from .signals import CODE, ORDER, of_stage
from .signals.dependency import PROXY_ROLE
from .snapshot import Snapshot
from .stores import is_local_store, measured_latency, store_table
from .thresholds import Thresholds
from .topology import Endpoint, EndpointRole

NO_FAILURE = np.int64(len(ORDER))  # larger than every constraint code: "passes"
DEFAULT_INGRESS: None = None  # table key: each GPU entered from its own region's gateway


@dataclass(frozen=True, eq=False)
class DependencyTable:
    """For one service kind and endpoint role: the best endpoint per GPU and its latency
    (round trip from the GPU's chosen port plus the endpoint's p99)."""

    endpoints: tuple[Endpoint, ...]
    best: np.ndarray  # index into `endpoints`, per GPU
    latency: np.ndarray  # seconds per GPU (inf: unreachable)


@dataclass(frozen=True, eq=False)
class PathTable:
    """Per GPU of the topology, for one (snapshot, thresholds, ingress)."""

    thresholds: Thresholds
    ingress: int | None  # fabric node, or None for each GPU's regional gateway
    code: np.ndarray  # first snapshot-only constraint failed (ORDER index), NO_FAILURE if none
    network: np.ndarray  # round-trip seconds through the best admissible port (inf: none)
    sigma2: np.ndarray  # path variance + GPU queueing variance
    port: np.ndarray  # chosen port (-1: none)
    raw_network: np.ndarray  # best round trip ignoring port thresholds (for explanations)
    wait: np.ndarray  # seconds the tick's signals add to the predicted queueing (measured queues)
    _deps: dict[tuple[str, EndpointRole], DependencyTable] = field(default_factory=dict, repr=False)
    # per contract table: everything of a request that depends on this tick and that contract
    # alone (`tick_table.py`), built on first use and kept for the tick; and the contract
    # tables requests read (what the next tick warms)
    contracts: dict = field(default_factory=dict, repr=False)
    used_contracts: set = field(default_factory=set, repr=False)

    def dependency(self, snap: Snapshot, kind: str, role: EndpointRole) -> DependencyTable:
        """The table for one service kind and role, built on first use and kept."""
        key = (kind, role)
        hit = self._deps.get(key)
        if hit is None:
            hit = self._deps[key] = _dependency_table(snap, self, kind, role)
        return hit

    def dependency_keys(self) -> tuple[tuple[str, EndpointRole], ...]:
        return tuple(self._deps)


def path_table(snap: Snapshot, thresholds: Thresholds, ingress: int | None) -> PathTable:
    """The snapshot's table for these thresholds and ingress, for a request (built once,
    then shared by every request and thread of the tick; a race builds it twice,
    identically). Marked used, so the next tick warms it."""
    key = (thresholds, ingress)
    snap.used.add(key)
    return _table(snap, key)


def _table(snap: Snapshot, key: tuple[Thresholds, int | None]) -> PathTable:
    hit = snap.tables.get(key)
    if hit is None:
        hit = snap.tables[key] = _build(snap, *key)
    return hit


def warm_steps(snap: Snapshot, previous: Snapshot | None) -> Iterator[str]:
    """Build, ahead of the first request, the tables requests read on the previous snapshot
    (and always the default one: each GPU entered from its region's gateway), one table per
    step (a path table, then each of its dependency tables), yielding after each so that
    a refresher on the serving event loop lets requests in between two. A table the
    previous tick only warmed is let go: the conservative table of a moment's staleness,
    say, is not rebuilt every tick ever after. Each costs about a millisecond at 8,000 GPUs;
    a path table is built in three steps (`_build_steps`: ~0.05, 0.2 and 0.05 ms of CPU at
    2,048 GPUs, where in one it was ~0.3 ms)."""
    keys: dict[tuple[Thresholds, int | None], tuple[tuple[str, EndpointRole], ...]] = {(snap.thresholds, None): ()}
    if previous is not None and previous.topology is snap.topology:
        for k in tuple(previous.used):  # a copy: requests may still be adding to it
            table = previous.tables.get(k)
            if table is not None:
                keys[k] = table.dependency_keys()
    for key, deps in keys.items():
        if key[1] is not None and key[1] not in snap.fabric_rows:
            continue
        table = snap.tables.get(key)
        if table is None:
            built = yield from _build_steps(snap, *key)
            table = snap.tables.setdefault(key, built)  # a request may have built it meanwhile: theirs is kept
        yield "path table"
        for kind, role in deps:
            table.dependency(snap, kind, role)
            yield "dependency table"


def ingress_rows(snap: Snapshot, ingress: int | None) -> np.ndarray:
    """Row of the fabric distance tables each GPU's request enters from."""
    t = snap.topology
    if ingress is not None:
        return np.full(len(t.gpus), snap.fabric_rows[ingress], dtype=np.int64)
    node_rows = np.full(len(t.fabric_nodes), -1, dtype=np.int64)
    for node, row in snap.fabric_rows.items():
        node_rows[node] = row
    return node_rows[t.gpu_ingress]


def _build(snap: Snapshot, th: Thresholds, ingress: int | None) -> PathTable:
    """The table at once (a request's first use)."""
    steps = _build_steps(snap, th, ingress)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def _build_steps(snap: Snapshot, th: Thresholds, ingress: int | None) -> Generator[str, None, PathTable]:
    """The table in three steps, yielding between two (for `warm_steps` on a serving
    loop): the columns of the tick's signals that do not read the paths; the best port per
    GPU (`port_paths.best_ports`, most of the cost); the columns of those that do, and the
    rest. A signal's refusals fold into the constraint code (the first in `ORDER` wins), its
    seconds into `wait`."""
    t = snap.topology
    n = len(t.gpus)
    x = TickInputs(snap, th, EVERY, ingress_rows(snap, ingress), snap.port_paths.get((th, ingress)))
    code = np.full(n, NO_FAILURE, dtype=np.int64)
    wait = np.zeros(n)
    signals = of_stage(Stage.TICK)

    def run(s: Signal[TickInputs]) -> None:
        nonlocal wait
        col = s.column(x)
        if col.fail is not None:
            np.minimum(code, np.where(col.fail, CODE[s.constraint], NO_FAILURE), out=code)
        if col.latency is not None:
            wait = wait + col.latency

    for s in signals:
        if not s.reads_paths:
            run(s)
    yield "path table: marks"
    paths = snap.port_paths[(th, ingress)] = x.paths  # kept for the snapshots that take the readings again
    yield "path table: best ports"
    for s in signals:
        if s.reads_paths:
            run(s)
    sigma2 = paths.var + snap.gpu_sigma ** 2
    for a in (code, paths.net, sigma2, paths.port, paths.raw_net, wait):
        a.setflags(write=False)
    return PathTable(th, ingress, code, paths.net, sigma2, paths.port, paths.raw_net, wait)


def _dependency_table(snap: Snapshot, table: PathTable, kind: str, role: EndpointRole) -> DependencyTable:
    t, f = snap.topology, snap.frame
    if is_local_store(kind):  # the store on the GPU's NUMA node: no fabric hop, any role
        st = store_table(t, kind)
        return DependencyTable(st.endpoints, st.best, measured_latency(st, kind, f.measured))
    eps = tuple(e for e in t.endpoints if e.kind == kind and e.role is role)
    n = len(t.gpus)
    if not eps:
        return DependencyTable(eps, np.zeros(n, dtype=np.int64), np.full(n, np.inf))
    chosen = np.where(table.port >= 0, table.port, 0)
    leaf = t.port_switch[chosen] if len(t.ports) else np.zeros(n, dtype=np.int64)
    rows = np.array([snap.fabric_rows[e.node] for e in eps])
    p99 = np.array([f.endpoint_p99[t.endpoint_index[e.name]] for e in eps])
    lat = 2.0 * (snap.fabric_dist[rows][:, leaf] + snap.port_delay[chosen]) + p99[:, None]  # E x GPUs
    best = np.argmin(lat, axis=0)
    latency = lat[best, np.arange(n)]
    best.setflags(write=False)
    latency.setflags(write=False)
    return DependencyTable(eps, best, latency)


__all__ = ["DEFAULT_INGRESS", "PROXY_ROLE", "DependencyTable", "PathTable", "ingress_rows", "path_table", "warm_steps"]
