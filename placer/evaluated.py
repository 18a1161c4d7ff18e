"""A request's evaluated candidates, as the choice reads them.

Choosing a GPU needs little of an `Evaluation`: which candidates failed, their ranks, and
then the chosen row's figures for the plan. For a handful of candidates those are Python
lists straight from the scalar path (`lookup.scalar_figures`), and building the numpy
`Evaluation` (a dozen small arrays) would cost more than the choice itself; so it is built
only when something reads all of it: a refusal, a session move, or a plan's explanation
when someone reads it. Above `lookup.SCALAR_MAX` candidates the evaluation is numpy's and
the lists are read off it. Either way the choice runs on the same lists, so both ways
choose alike (the tests compare the plans).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple, Sequence

import numpy as np

from .candidate_sets import Gathered
from .evaluate import Evaluation
from .lookup import _Row, figures_of, scalar_evaluation
from .plan import DependencyBinding
from .sites import Site, Sites
from .snapshot import Snapshot
from .tick_table import DEPENDENCIES, MIN_SHARE, NETWORK, SIGMA, TickContractTable


class RowFixed(NamedTuple):
    """What a plan on one candidate states that no request changes within its tick: its
    figures but the share-dependent queueing and compute (`Evaluated.row` gives those
    beside it), with where its GPU is (`site`) and the probes the plan asks for (the
    site's, then one per dependency binding; a stale snapshot's probe is the request's
    own)."""

    gpu: int
    port: int
    network: float
    dependencies: float
    sigma: float
    min_share: float
    bindings: tuple[DependencyBinding, ...]
    site: Site
    probes: tuple[str, ...]


def row_fixed(snap: Snapshot, sites: Sites, gpu: int, port: int, network: float, dependencies: float, sigma: float,
              min_share: float, bindings: tuple[DependencyBinding, ...]) -> RowFixed:
    """`RowFixed` for a candidate on `gpu` reached through `port` on `snap`."""
    where = sites.get(snap, gpu, port)
    probes = where.probes
    if bindings:
        probes += tuple(f"dependency_p99:{b.endpoint}" for b in bindings)
    return RowFixed(gpu, port, network, dependencies, sigma, min_share, bindings, where, probes)


class Evaluated(ABC):
    """`gpus`, `fail` and `rank` as lists aligned with the candidates; `best` (-1 when none
    is feasible) and `feasible`; `row(r)`; `evaluation()`, the whole numpy account."""

    __slots__ = ("gpus", "fail", "rank", "feasible", "best")

    def __init__(self, gpus: Sequence[int], fail: Sequence[int], rank: Sequence[float]) -> None:
        self.gpus = gpus
        self.fail = fail
        self.rank = rank
        self.feasible = feas = [i for i, code in enumerate(fail) if code < 0]
        self.best = _first_least(rank, feas)

    @staticmethod
    def of_lists(gpus: np.ndarray, rows: Sequence[int], table: TickContractTable, gathered: Gathered,
                 outs: list[_Row]) -> "Evaluated":
        """From the scalar path: `gathered`, the candidates' rows of `table`'s block (held
        here for as long as this evaluation lives: a plan's explanation may read it later);
        `outs`, their figures row by row (`lookup.scalar_rows`)."""
        return _FromLists(gpus, rows, table, gathered, outs)

    @staticmethod
    def of_evaluation(ev: Evaluation) -> "Evaluated":
        return _FromEvaluation(ev)

    @abstractmethod
    def row(self, r: int, snap: Snapshot, sites: Sites) -> tuple[RowFixed, float, float]:
        """Candidate `r`'s figures, as its plan states them: the tick's fixed part, then
        queueing and compute (`snap`: the snapshot they were evaluated on; `sites`: where
        its GPUs are, per snapshot)."""

    @abstractmethod
    def evaluation(self) -> Evaluation:
        """The whole numpy account (every candidate, every figure)."""

    def first_feasible_on(self, gpu: int) -> int:
        """The first feasible candidate on topology GPU `gpu`, or -1."""
        gpus = self.gpus
        for r in self.feasible:
            if gpus[r] == gpu:
                return r
        return -1


def _first_least(rank: Sequence[float], rows: list[int]) -> int:
    """np.argmin over `rank` at `rows`: the first minimum, a NaN winning as it does there
    (the first NaN); -1 for no rows. Without a NaN or infinities of both signs the sum is
    a number, and `min` (which keeps the first of equal keys) answers in C; otherwise the
    rows are walked as argmin walks them."""
    if not rows:
        return -1
    key = rank.__getitem__
    total = sum(map(key, rows))
    if total == total:
        return min(rows, key=key)
    best, low = -1, 0.0
    for i in rows:
        x = rank[i]
        if x != x:
            return i
        if best < 0 or x < low:
            best, low = i, x
    return best


class _FromLists(Evaluated):
    __slots__ = ("_array", "_table", "_gathered", "_outs", "_ev")

    def __init__(self, gpus: np.ndarray, rows: Sequence[int], table: TickContractTable, gathered: Gathered,
                 outs: list[_Row]) -> None:
        _, _, rank, _, fail = zip(*outs)  # the columns the choice reads (made in C)
        super().__init__(rows, fail, rank)
        self._array = gpus
        self._table = table
        self._gathered = gathered
        self._outs = outs
        self._ev: Evaluation | None = None

    def row(self, r: int, snap: Snapshot, sites: Sites) -> tuple[RowFixed, float, float]:
        """The row's fixed part is written once per tick (kept with the gather of that
        tick's table), the share-dependent part read off this request's figures."""
        gathered, o = self._gathered, self._outs[r]
        k = gathered.fixed[r]
        if k is None:
            x = gathered.rows[r]
            k = gathered.fixed[r] = row_fixed(snap, sites, self.gpus[r], int(x[self._table.layout.port]), x[NETWORK],
                                              x[DEPENDENCIES], x[SIGMA], x[MIN_SHARE], gathered.bindings(r))
        return k, o[0], o[1]

    def evaluation(self) -> Evaluation:
        """Built on first call (a refusal, a session, a plan's explanation read); two
        threads racing here build the same figures twice, and either result is kept."""
        ev = self._ev
        if ev is None:
            ev = self._ev = scalar_evaluation(self._table, self._gathered.g, self._array, figures_of(self._outs))
        return ev


class _FromEvaluation(Evaluated):
    __slots__ = ("_ev",)

    def __init__(self, ev: Evaluation) -> None:
        super().__init__(ev.gpus.tolist(), ev.fail.tolist(), ev.rank.tolist())
        self._ev = ev

    def row(self, r: int, snap: Snapshot, sites: Sites) -> tuple[RowFixed, float, float]:
        ev = self._ev
        k = row_fixed(snap, sites, int(ev.gpus[r]), int(ev.port[r]), float(ev.network[r]), float(ev.dependencies[r]),
                      float(ev.sigma[r]), float(ev.min_share[r]), ev.bindings(r))
        return k, float(ev.queueing[r]), float(ev.compute[r])

    def evaluation(self) -> Evaluation:
        return self._ev


__all__ = ["Evaluated", "RowFixed", "row_fixed"]
