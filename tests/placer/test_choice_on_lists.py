"""Choosing among the candidates on Python lists must pick what numpy's argmin over the
feasible rows picks: the first minimum, NaN first, ties to the earlier row; and a placer
that evaluates a handful of candidates on Python scalars makes the numpy placer's plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policyc.placer import placer as placer_module
from policyc.placer.evaluate import Evaluation
from policyc.placer.evaluated import Evaluated


def _ev(fail: list[int], rank: list[float], gpus: list[int]) -> Evaluation:
    n = len(fail)
    z = np.zeros(n)
    return Evaluation(gpus=np.array(gpus, dtype=np.int64), fail=np.array(fail, dtype=np.int64), min_share=z,
                      port=np.zeros(n, dtype=np.int64), network=z, queueing=z, compute=z, dependencies=z, sigma=z,
                      rank=np.array(rank, dtype=np.float64), raw_total=z, dep_best=())


CASES = [
    ([-1, -1, -1], [3.0, 1.0, 1.0], [7, 8, 9]),  # tie: the earlier row
    ([2, -1, -1], [0.5, 2.0, 1.0], [7, 8, 9]),  # the infeasible best is not chosen
    ([-1, -1, -1], [1.0, float("nan"), 0.5], [7, 8, 9]),  # NaN wins, as in argmin
    ([-1, -1], [float("inf"), float("inf")], [4, 4]),
    ([3, 8], [1.0, 2.0], [1, 2]),  # none feasible
    ([-1, -1, -1], [-0.0, 0.0, -0.0], [1, 2, 3]),
    ([-1, -1, -1], [float("inf"), 2.0, float("-inf")], [1, 2, 3]),  # infinities of both signs: the sum is NaN
    ([-1, -1, -1, -1], [2.0, float("inf"), float("nan"), float("nan")], [1, 2, 3, 4]),  # the first NaN
    ([-1, 5, -1], [float("inf"), float("nan"), 1.0], [1, 2, 3]),  # an infeasible NaN does not win
]

RANKS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0, float("nan")]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([-1, -1, 0, 3]), RANKS), max_size=12))
def test_the_choice_is_argmins_on_any_ranks(rows: list[tuple[int, float]]) -> None:
    fail, rank = [f for f, _ in rows], [r for _, r in rows]
    ev = _ev(fail, rank, list(range(len(rows))))
    feasible = np.flatnonzero(ev.fail < 0)
    best = int(feasible[np.argmin(ev.rank[feasible])]) if len(feasible) else -1
    assert Evaluated.of_evaluation(ev).best == best


@pytest.mark.parametrize("fail,rank,gpus", CASES)
def test_lists_choose_what_argmin_chooses(fail: list[int], rank: list[float], gpus: list[int]) -> None:
    ev = _ev(fail, rank, gpus)
    chosen = Evaluated.of_evaluation(ev)
    feasible = np.flatnonzero(ev.fail < 0)  # the oracle: numpy over the arrays
    best = int(feasible[np.argmin(ev.rank[feasible])]) if len(feasible) else -1
    assert chosen.feasible == feasible.tolist() and chosen.best == best
    for g in set(gpus) | {99}:
        hit = np.flatnonzero(ev.gpus[feasible] == g)
        assert chosen.first_feasible_on(g) == (int(feasible[hit[0]]) if len(hit) else -1)
    assert chosen.evaluation() is ev


def test_a_placer_on_lists_makes_the_numpy_placers_plans(monkeypatch) -> None:
    """End to end: the same requests (bursts within ticks, sticky keys, sessions) give the
    same plans, figure for figure and word for word, whichever way the candidates are read."""
    from placer_support import replay

    from policyc.placer import lookup as lookup_module

    def run(scalar_max: int) -> list:
        monkeypatch.setattr(lookup_module, "SCALAR_MAX", scalar_max)
        monkeypatch.setattr(placer_module, "SCALAR_MAX", scalar_max)
        return replay(120)

    lists, arrays = run(32), run(0)
    assert lists == arrays
    plans = [x for x in lists if isinstance(x, tuple)]
    assert len(plans) > 100 and any(any("kept" in y or "session" in y for y in x[2]) for x in plans)
