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
from .lookup import Figures, scalar_evaluation
from .plan import DependencyBinding
from .tick_table import DEPENDENCIES, MIN_SHARE, NETWORK, SIGMA, TickContractTable


class RowFigures(NamedTuple):
    """One candidate's figures, as its plan states them."""

    gpu: int
    port: int  # -1: none
    network: float
    queueing: float
    compute: float
    dependencies: float
    sigma: float
    min_share: float
    bindings: tuple[DependencyBinding, ...]


class Evaluated(ABC):
    """`gpus`, `fail` and `rank` as lists aligned with the candidates; `best` (-1 when none
    is feasible) and `feasible`; `row(r)`; `evaluation()`, the whole numpy account."""

    __slots__ = ("gpus", "fail", "rank", "feasible", "best")

    def __init__(self, gpus: Sequence[int], fail: Sequence[int], rank: Sequence[float]) -> None:
        self.gpus = gpus
        self.fail = fail
        self.rank = rank
        self.feasible = feas = [i for i, code in enumerate(fail) if code < 0]
        # np.argmin over the feasible rows' ranks: the first minimum, NaN winning as it does there
        best, low = -1, 0.0
        for i in feas:
            x = rank[i]
            if x != x:
                best = i
                break
            if best < 0 or x < low:
                best, low = i, x
        self.best = best

    @staticmethod
    def of_lists(gpus: np.ndarray, rows: list[int], table: TickContractTable, gathered: Gathered, f: Figures) -> "Evaluated":
        """From the scalar path: `gathered`, the candidates' rows of `table`'s block (held
        here for as long as this evaluation lives: a plan's explanation may read it later);
        `f`, their figures."""
        return _FromLists(gpus, rows, table, gathered, f)

    @staticmethod
    def of_evaluation(ev: Evaluation) -> "Evaluated":
        return _FromEvaluation(ev)

    @abstractmethod
    def row(self, r: int) -> RowFigures:
        """Candidate `r`'s figures, as its plan states them."""

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


class _FromLists(Evaluated):
    __slots__ = ("_array", "_table", "_gathered", "_figures", "_ev")

    def __init__(self, gpus: np.ndarray, rows: list[int], table: TickContractTable, gathered: Gathered, f: Figures) -> None:
        super().__init__(rows, f.fail, f.rank)
        self._array = gpus
        self._table = table
        self._gathered = gathered
        self._figures = f
        self._ev: Evaluation | None = None

    def row(self, r: int) -> RowFigures:
        x, f = self._gathered.rows[r], self._figures
        return RowFigures(self.gpus[r], int(x[self._table.layout.port]), x[NETWORK], f.queueing[r],
                          f.compute[r], x[DEPENDENCIES], x[SIGMA], x[MIN_SHARE], self._gathered.bindings(r))

    def evaluation(self) -> Evaluation:
        """Built on first call (a refusal, a session, a plan's explanation read); two
        threads racing here build the same figures twice, and either result is kept."""
        ev = self._ev
        if ev is None:
            ev = self._ev = scalar_evaluation(self._table, self._gathered.g, self._array, self._figures)
        return ev


class _FromEvaluation(Evaluated):
    __slots__ = ("_ev",)

    def __init__(self, ev: Evaluation) -> None:
        super().__init__(ev.gpus.tolist(), ev.fail.tolist(), ev.rank.tolist())
        self._ev = ev

    def row(self, r: int) -> RowFigures:
        ev = self._ev
        return RowFigures(int(ev.gpus[r]), int(ev.port[r]), float(ev.network[r]), float(ev.queueing[r]),
                          float(ev.compute[r]), float(ev.dependencies[r]), float(ev.sigma[r]),
                          float(ev.min_share[r]), ev.bindings(r))

    def evaluation(self) -> Evaluation:
        return self._ev


__all__ = ["Evaluated", "RowFigures"]
