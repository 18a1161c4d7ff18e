"""Latency budget: the predicted end-to-end latency (network + queueing + compute +
dependencies) over the share of the request's budget a plan may use.

A `REQUEST` signal: the budget is the request's, so its filter is the runners' per-request
arithmetic (`refuses`; `lookup.scalar_rows` unrolls it)."""

from __future__ import annotations

import numpy as np

from ..framework import Column, RequestInputs, Signal, Stage, Words
from ..plan import Constraint


def refuses(total: np.ndarray, limit: float) -> np.ndarray:
    """The candidates whose prediction is not within `limit` seconds (NaN too)."""
    return ~(total <= limit)


class LatencyBudget(Signal[RequestInputs]):
    name = "latency_budget"
    constraint = Constraint.LATENCY_BUDGET
    consumes = ()  # every other signal's figures, through the prediction
    stage = Stage.REQUEST

    def reference(self, x: RequestInputs) -> Column:
        return Column(fail=refuses(x.total, x.limit))

    def detail(self, w: Words, r: int) -> str:
        return f"predicted {w.ev.total[r] * 1e3:.1f} ms > budget {w.budget * w.th.budget_fraction * 1e3:.1f} ms"
