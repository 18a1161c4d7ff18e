"""A request's candidate set, remembered while the same set keeps coming back.

The decision service hands the placer the same candidates (the matcher's best instances
of a model, the same `Instance` objects in the same order) for every request of a shape
until the registry changes: hundreds of requests a second over a few dozen sets. What the
placer derives from a set alone (each candidate's GPU row, which candidates have none)
holds for as long as the topology does, and the candidates' rows of a per-tick table's
block (`tick_table.py`) hold for that tick; only the shares reserved since and the
arithmetic on them (`lookup.scalar_figures`) change from one request to the next.

A set is keyed by the identities of its instances, in order, and a hit is only taken when
the remembered objects *are* the candidates (the set keeps them, so no identity can be
reused while its entry lives). Past `limit` sets the oldest is let go, one per new set
(`oldest_first.py`). A set keeps the gather of one tick table at a time, and which
(snapshot, thresholds, ingress, contract table) it was for, so the next request of the
set on that tick skips the two table look-ups (each hashes the thresholds). The decision
service hands over each window as the same tuple every time (until its shape is ranked
again), so the tuples handed over lately find their set by identity first.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from operator import is_, itemgetter
from typing import Sequence

import numpy as np

from policyc.matcher.instance import Instance

from .candidate_rows import CandidateRows
from .evaluate import binding
from .contract_table import ContractTable
from .oldest_first import put_newest
from .paths import path_table
from .plan import Constraint, DependencyBinding, NoPlacement, Rejection
from .snapshot import Snapshot
from .thresholds import Thresholds
from .tick_table import TickContractTable, tick_table
from .topology import Topology

# candidate sets remembered. A few dozen recur at a time, but score pushes re-rank the
# shapes every tick and each re-ranking can hand the placer new sets (~13 a second at
# 1,000 decisions/s); the ones left behind stay until they are the oldest, ~30 tracked
# objects each, all of which the collector's full passes scan.
DEFAULT_LIMIT = 256
TUPLES_PER_SET = 4  # window tuples remembered per set (a re-ranking hands over new tuples of the same sets)


class Gathered:
    """A candidate set's rows of one tick table's block: `g` (array), `rows` (Python lists),
    per candidate the endpoints its declared services bind to (worked out on first use:
    they depend on the tick and the GPU alone), the figures worked out on them so far this
    tick (`figures`), the last refusal written for them (`refusal`), and per row what a plan
    placed on it states that no request changes this tick (`fixed`: where the GPU is, its
    probes, its figures apart from the share-dependent ones; see `evaluated.RowFixed`).

    The table itself is held weakly: a set that is no longer asked for stays in the memo
    until it is the oldest and let go, and it must not keep its last tick's table alive (a few hundred
    KB of per-GPU arrays each; held strongly, a server making 1,000 decisions a second grew
    by ~3 MB a second). Whoever uses the rows holds the table (`CandidateSet.gather`'s
    caller)."""

    __slots__ = ("_table", "g", "rows", "figures", "refusal", "_bindings", "_services", "fixed")

    def __init__(self, tt: TickContractTable, gpus: np.ndarray) -> None:
        self._table = weakref.ref(tt)
        self.g = tt.block[gpus]
        # tuples of floats: the collector stops tracking them after one pass (lists it scans every time)
        self.rows: tuple[tuple[float, ...], ...] = tuple(map(tuple, self.g.tolist()))
        lay = tt.layout
        self._services = [(svc, eps, lay.latency(i), lay.best(i)) for i, (svc, eps, _, _) in enumerate(tt.services)]
        self._bindings: list[tuple[DependencyBinding, ...] | None] = [None] * len(self.rows)
        # the scalar path's latest figures per row, before the budget check (`lookup.scalar_figures`)
        self.figures: list[tuple[float, float, tuple, tuple] | None] = [None] * len(self.rows)
        self.refusal: tuple[tuple, NoPlacement] | None = None  # the last refusal, by (reserved shares, budget)
        # per row, what a plan on it states that no request changes this tick (`evaluated.RowFixed`),
        # written by the first plan placed on it
        self.fixed: list = [None] * len(self.rows)

    def is_of(self, tt: TickContractTable) -> bool:
        return self._table() is tt

    def bindings(self, r: int) -> tuple[DependencyBinding, ...]:
        hit = self._bindings[r]
        if hit is None:
            x = self.rows[r]
            bound = (binding(svc, eps, int(x[bi]), x[li]) for svc, eps, li, bi in self._services)
            hit = self._bindings[r] = tuple(b for b in bound if b is not None)
        return hit


class CandidateSet:
    """One candidate sequence on one topology: the candidates' GPU rows (`rows`, and as an
    array `gpus`), the candidates those rows belong to (`known`), and a refusal line for
    each candidate whose GPU the topology lacks (`unknown`)."""

    __slots__ = ("topology", "candidates", "rows", "gpus", "known", "unknown", "_gathered", "_tick", "_take")

    def __init__(self, topology: Topology, candidates: tuple[Instance, ...], rows_memo: CandidateRows) -> None:
        rows, known, missing = rows_memo.rows(topology, candidates)
        self.topology = topology
        self.candidates = candidates
        self.rows = tuple(rows)  # (untracked by the collector after one pass, as a list is not)
        self.gpus = np.array(rows, dtype=np.int64)
        self._take = itemgetter(*rows) if len(rows) > 1 else None  # (one row: itemgetter gives the value, not a tuple)
        self.known = known
        self.unknown = [Rejection(x.id, Constraint.UNKNOWN_GPU, f"`{x.deployment.host}/{x.deployment.gpu}` is not in the topology")
                        for x in missing]
        self._gathered: Gathered | None = None
        # (snapshot, thresholds, ingress, contract table, tick table) of the last `gathered`,
        # all but the thresholds held weakly (a set no longer asked for keeps no tick alive)
        self._tick: tuple[weakref.ref, Thresholds, int | None, weakref.ref, weakref.ref] | None = None

    def take(self, per_gpu: list[float]) -> tuple[float, ...]:
        """`per_gpu`'s values at this set's rows, in order."""
        take = self._take
        return take(per_gpu) if take is not None else tuple(per_gpu[g] for g in self.rows)

    def gathered(self, snap: Snapshot, th: Thresholds, ingress: int | None,
                 table: ContractTable) -> tuple[TickContractTable, Gathered]:
        """The tick table for (`snap`, `th`, `ingress`, `table`) and this set's gather of it:
        `tick_table(snap, path_table(snap, th, ingress), table)`, looked up only when the
        set last asked for other ones (those look-ups marked the tables used already)."""
        k = self._tick
        if k is not None and k[1] is th and k[2] == ingress and k[0]() is snap and k[3]() is table:
            tt = k[4]()
            hit = self._gathered
            if tt is not None and hit is not None and hit.is_of(tt):
                return tt, hit
        tt = tick_table(snap, path_table(snap, th, ingress), table)
        self._tick = (weakref.ref(snap), th, ingress, weakref.ref(table), weakref.ref(tt))
        return tt, self.gather(tt)

    def gather(self, tt: TickContractTable) -> Gathered:
        """The candidates' rows of `tt.block`, kept while `tt` is the table asked for."""
        hit = self._gathered
        if hit is None or not hit.is_of(tt):
            hit = self._gathered = Gathered(tt, self.gpus)  # one assignment: a racing reader sees one or the other
        return hit


class CandidateSets:
    """`get(topology, candidates)` -> the `CandidateSet`, remembered while it recurs."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._sets: OrderedDict[tuple[int, ...], CandidateSet] = OrderedDict()
        self.rows = CandidateRows()
        # the tuples handed over lately -> (the tuple, its set): kept with the tuple, so its id
        # names it while the entry lives
        self._tuples: OrderedDict[int, tuple[tuple[Instance, ...], CandidateSet]] = OrderedDict()

    def get(self, topology: Topology, candidates: Sequence[Instance]) -> CandidateSet:
        pair = self._tuples.get(id(candidates))
        if pair is not None and pair[0] is candidates and pair[1].topology is topology:
            return pair[1]  # the same tuple object: its instances are the set's, in order
        key = tuple(map(id, candidates))
        hit = self._sets.get(key)
        if hit is None or hit.topology is not topology or not all(map(is_, hit.candidates, candidates)):
            hit = put_newest(self._sets, key, CandidateSet(topology, tuple(candidates), self.rows), self._limit)
        if type(candidates) is tuple:
            put_newest(self._tuples, id(candidates), (candidates, hit), TUPLES_PER_SET * self._limit)
        return hit


__all__ = ["CandidateSet", "CandidateSets", "Gathered"]
