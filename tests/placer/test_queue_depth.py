"""The queue-depth signal end to end: a model server's measured queue steers placement
through the placer's own tables, a stale reading is reported and handled as the signal
declares (fall back, or exclude), never silently used, and the tables still give the
reference evaluation's figures."""

from __future__ import annotations

import numpy as np
import pytest
from placer_support import contract, instances, redis
from test_lookup_tables import _assert_same
from test_signals import CATALOG, _world

from policyc.placer import Constraint, NoPlacement, PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.contract_table import contract_table
from policyc.placer.evaluate import evaluate
from policyc.placer.framework import OnStale
from policyc.placer.latency import GPU_QUANTUM
from policyc.placer.lookup import lookup
from policyc.placer.measured import WithReadings
from policyc.placer.paths import ingress_rows
from policyc.placer.readings import Reading
from policyc.placer.signals import REGISTRY


def _placer(readings: dict[str, Reading]) -> tuple[Placer, list]:
    sim = SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)
    now = [0.0]
    r = Refresher(WithReadings(sim, lambda: readings), clock=lambda: now[0])
    r.tick()
    return Placer(r, clock=lambda: now[0]), instances(sim)


def _place(p: Placer, cands: list, key: str = "k") -> PlacementPlan | NoPlacement:
    return p.place(cands[:4], 0.2, contract(), affinity_key=key)


def test_a_deep_queue_moves_the_placement_and_enters_its_prediction() -> None:
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    deep = {first.gpu_key: Reading({"queue_depth": 30.0}, 0.01)}
    p, cands = _placer(deep)
    moved = _place(p, cands)
    assert isinstance(moved, PlacementPlan) and moved.gpu_key != first.gpu_key
    # on the deep GPU alone, the measured queue is in the plan's queueing
    only = [c for c in cands if f"{c.deployment.host}/{c.deployment.gpu}" == first.gpu_key]
    there = p.place(only, 0.2, contract(), affinity_key="only")
    assert isinstance(there, PlacementPlan)
    assert there.latency.queueing == pytest.approx(first.latency.queueing + 30 * GPU_QUANTUM)


def test_a_stale_reading_falls_back_to_the_model_and_the_plan_says_so() -> None:
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    stale = {f"{c.deployment.host}/{c.deployment.gpu}": Reading({"queue_depth": 30.0}, 2.0) for c in cands[:4]}
    p, cands = _placer(stale)
    plan = _place(p, cands)
    assert isinstance(plan, PlacementPlan)
    assert (plan.gpu_key, plan.latency) == (first.gpu_key, first.latency)  # the old number is not used
    notes = [x for x in plan.reasons if "queue depth" in x]
    assert notes and "stale" in notes[0] and "2.00 s old" in notes[0] and plan.gpu_key in notes[0], plan.reasons


def test_a_signal_declared_to_exclude_refuses_stale_readings_by_name(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(REGISTRY["queue_depth"], "on_stale", OnStale.EXCLUDE)
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    keys = [f"{c.deployment.host}/{c.deployment.gpu}" for c in cands[:4]]
    stale = {k: Reading({"queue_depth": 1.0}, 0.9) for k in keys}
    p, cands = _placer(stale)
    out = _place(p, cands)
    assert isinstance(out, NoPlacement) and out.binding is Constraint.QUEUE_DEPTH, out
    assert all(x.constraint is Constraint.QUEUE_DEPTH and "0.90 s old" in x.detail for x in out.rejected)
    stale[first.gpu_key] = Reading({"queue_depth": 1.0}, 0.05)  # one fresh reading
    p, cands = _placer(stale)
    plan = _place(p, cands)
    assert isinstance(plan, PlacementPlan) and plan.gpu_key == first.gpu_key
    assert {x.constraint for x in plan.rejected} == {Constraint.QUEUE_DEPTH}
    assert "rejected: 3 by queue_depth" in plan.reasons


def test_a_bounded_queue_refuses_deeper_ones(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(REGISTRY["queue_depth"], "max_depth", 10.0)
    quiet, cands = _placer({})
    first = _place(quiet, cands)
    assert isinstance(first, PlacementPlan)
    p, cands = _placer({first.gpu_key: Reading({"queue_depth": 12.0}, 0.0)})
    plan = _place(p, cands)
    assert isinstance(plan, PlacementPlan) and plan.gpu_key != first.gpu_key
    rej = [x for x in plan.rejected if x.gpu == first.gpu_key]
    assert rej and rej[0].constraint is Constraint.QUEUE_DEPTH and rej[0].detail == "queue depth 12 > 10 waiting requests"


@pytest.mark.parametrize("on_stale", list(OnStale))
@pytest.mark.parametrize("k", [8, 40])  # the scalar path and numpy's
def test_the_tables_give_the_reference_figures_with_readings(monkeypatch, on_stale: OnStale, k: int) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(REGISTRY["queue_depth"], "on_stale", on_stale)
    monkeypatch.setattr(REGISTRY["queue_depth"], "max_depth", 25.0)
    snap = _world()
    t = snap.topology
    c = contract(services=(redis(proxy="dedicated"),))
    table = contract_table(c, t, CATALOG)
    rng = np.random.default_rng(k)
    saw = set()
    for budget in (0.2, 0.04):
        for _ in range(6):
            gpus = rng.choice(len(t.gpus), k, replace=False).astype(np.int64)
            reserved = rng.uniform(0, 0.3, k) * (rng.random(k) < 0.3)
            ref = evaluate(snap, snap.thresholds, gpus, table.bounds, CATALOG, c, budget, ingress_rows(snap, None)[gpus],
                           reserved)
            got = lookup(snap, snap.thresholds, gpus, None, table, reserved, budget)
            _assert_same(got, ref, f"queue depth {on_stale.value}")
            saw |= {ref.failed(i) for i in range(k)}
    assert Constraint.QUEUE_DEPTH in saw


def test_the_column_is_made_once_per_readings_and_settings() -> None:
    """Every path table of a tick reads the same column (the readings alone decide it), and
    a change of the signal's settings makes it afresh."""
    from policyc.placer.framework import EVERY, TickInputs
    from policyc.placer.signals.queue_depth import QueueDepth

    snap = _world()
    x = TickInputs(snap, snap.thresholds, EVERY, ingress_rows(snap, None))
    s = QueueDepth()
    first = s.column(x)
    assert s.column(TickInputs(snap, snap.thresholds.conservative(), EVERY, ingress_rows(snap, None))) is first
    assert first.fail is not None and not first.fail.any()
    s.max_depth = 10.0
    bounded = s.column(x)
    assert bounded is not first and bounded.fail is not None and bounded.fail.any()
    gpus = np.arange(0, len(snap.topology.gpus), 3)
    np.testing.assert_array_equal(s.column(TickInputs(snap, snap.thresholds, gpus, ingress_rows(snap, None)[gpus])).fail,
                                  bounded.fail[gpus])
