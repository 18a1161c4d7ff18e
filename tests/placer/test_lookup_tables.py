"""The per-tick tables are an optimisation, never a change of meaning: gathering a
request's rows from them must give the reference `evaluate`'s figures exactly."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from placer_support import contract, instances, redis

from policyc.compiler.bundle import GpuShare, ServiceDependency, Session
from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster, Thresholds
from policyc.placer.catalog import DEFAULT_CATALOG, catalog_by_name
from policyc.placer.contract_table import contract_table
from policyc.placer.evaluate import ORDER, evaluate
from policyc.placer import lookup as lookup_module
from policyc.placer.lookup import lookup
from policyc.placer.paths import ingress_rows, path_table
from policyc.placer.plan import Constraint, Explanation

from placer_support import REF

CATALOG = catalog_by_name(DEFAULT_CATALOG)
FIELDS = ("fail", "min_share", "port", "network", "queueing", "compute", "dependencies", "sigma", "rank", "raw_total")


def _world() -> tuple[SimulatedCluster, Refresher]:
    sim = SimulatedCluster(11, 48, 4, hosts_per_rack=6)
    t = sim.topology()
    rng = np.random.default_rng(1)
    for p in rng.choice(len(t.ports), 12, replace=False):  # congested, failed and flaring ports
        sim.watermark(t.port_key(int(p)), float(rng.uniform(0.5, 0.99)))
    sim.link_down(t.port_key(3))
    sim.link_down(t.port_key(4))
    for g in rng.choice(len(t.gpus), 8, replace=False):
        sim.sm_collapse(t.gpu_key(int(g)))
    sim.service_p99("redis-us-west", 0.8)
    r = Refresher(sim)
    r.tick()
    r.tick()
    return sim, r


CONTRACTS = {
    "plain": contract(),
    "heavy": contract(flops=4e13),
    "redis direct": contract(services=(redis(),)),
    "redis proxies": contract(services=(redis(proxy="dedicated"), ServiceDependency(
        name="db", kind="postgres", p99=20e-3, proxy="none", origin=REF), redis(p99=3e-3, proxy="shared"))),
    "no such service": contract(services=(ServiceDependency(name="m", kind="memcached", p99=1e-3, origin=REF),)),
    "session nvme": contract(session=Session(state="nvme", colocate="same_numa")),
    "http api and nvme store": contract(services=(
        ServiceDependency(name="catalog-api", kind="http", p99=30e-3, origin=REF),
        ServiceDependency(name="conversation-store", kind="nvme", p99=4e-3, origin=REF))),
    "nvme store too slow": contract(services=(ServiceDependency(name="st", kind="nvme", p99=1e-3, origin=REF),)),
    "solver shares": contract(gpu_shares=(
        GpuShare(gpu="H100", feasible=True, min_share=0.3, binding="compute", detail="d"),
        GpuShare(gpu="L4", feasible=False, binding="bandwidth", detail="too slow"))),
}


def _assert_same(got, ref, name: str) -> None:
    for f in FIELDS:
        a, b = getattr(got, f), getattr(ref, f)
        assert a.dtype == b.dtype, f"{name}: {f} dtype"
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: {f}")
    for (s1, e1, b1, l1), (s2, e2, b2, l2) in zip(got.dep_best, ref.dep_best, strict=True):
        assert s1 is s2 and [e.name for e in e1] == [e.name for e in e2]
        np.testing.assert_array_equal(b1, b2)
        np.testing.assert_array_equal(l1, l2)
    n = len(ref.gpus)
    assert [got.bindings(i) for i in range(n)] == [ref.bindings(i) for i in range(n)]
    assert [got.dependency_problem(i) for i in range(n)] == [ref.dependency_problem(i) for i in range(n)]


@pytest.mark.parametrize("name", sorted(CONTRACTS))
@pytest.mark.parametrize("ingress", [None, "ingress/us-east"])
@pytest.mark.parametrize("stale", [False, True])
@pytest.mark.parametrize("k", [1, 8, 40])  # 1, 8: the Python-scalar path (<= SCALAR_MAX); 40: numpy gathers
def test_lookup_equals_the_reference_evaluation(name: str, ingress: str | None, stale: bool, k: int) -> None:
    sim, r = _world()
    snap = r.current()
    t = snap.topology
    c = CONTRACTS[name]
    th = snap.thresholds.conservative() if stale else snap.thresholds
    node = None if ingress is None else t.fabric_index[ingress]
    table = contract_table(c, t, CATALOG)
    rng = np.random.default_rng(len(name))
    failed = False
    for budget in (0.2, 0.03):
        for _ in range(5):
            gpus = rng.choice(len(t.gpus), k, replace=False).astype(np.int64)
            reserved = rng.uniform(0, 0.3, len(gpus)) * (rng.random(len(gpus)) < 0.3)
            rows = ingress_rows(snap, node)[gpus]
            ref = evaluate(snap, th, gpus, table.bounds, CATALOG, c, budget, rows, reserved)
            got = lookup(snap, th, gpus, node, table, reserved, budget)
            _assert_same(got, ref, name)
            failed |= (got.fail >= 0).any()
    assert failed  # the world is hostile enough to exercise the constraints


@pytest.mark.parametrize("name", ["plain", "redis proxies", "solver shares"])
def test_both_ways_agree_on_every_gpu_including_nan_and_edge_shares(name: str, monkeypatch) -> None:
    """The scalar path against numpy's over all GPUs, with telemetry that breaks the easy
    cases: NaN and out-of-range free shares, reservations that take a GPU below zero."""
    sim, r = _world()
    snap = r.current()
    t = snap.topology
    free = snap.gpu_free.copy()
    free[::7] = np.nan
    free[1::11] = 1.5
    free[2::13] = -0.2
    free[3::17] = 0.0
    snap = dataclasses.replace(snap, gpu_free=free, tables={}, port_paths={})
    c = CONTRACTS[name]
    table = contract_table(c, t, CATALOG)
    rng = np.random.default_rng(3)
    gpus = np.arange(len(t.gpus), dtype=np.int64)
    reserved = rng.uniform(0, 1.2, len(gpus)) * (rng.random(len(gpus)) < 0.3)
    for budget in (0.2, 0.01):
        monkeypatch.setattr(lookup_module, "SCALAR_MAX", 0)
        wide = lookup(snap, snap.thresholds, gpus, None, table, reserved, budget)
        monkeypatch.setattr(lookup_module, "SCALAR_MAX", len(gpus))
        narrow = lookup(snap, snap.thresholds, gpus, None, table, reserved, budget)
        _assert_same(narrow, wide, name)
        rows = ingress_rows(snap, None)[gpus]
        ref = evaluate(snap, snap.thresholds, gpus, table.bounds, CATALOG, c, budget, rows, reserved)
        _assert_same(narrow, ref, name)
        assert np.isnan(narrow.compute).any() and np.isnan(narrow.queueing).any()  # NaN did reach the figures


def test_remembered_figures_are_the_figures_computed_afresh() -> None:
    """A tick table's memo of scalar figures (the latest per row, before the budget check,
    with the reservation they were worked out for) gives what computing them again gives,
    as reservations grow and budgets change (a budget per request, as a diverse mix sends:
    one slot per row serves them all), and holds one entry per row."""
    from policyc.placer.lookup import scalar_figures
    from policyc.placer.paths import path_table
    from policyc.placer.tick_table import tick_table

    sim, r = _world()
    snap = r.current()
    c = CONTRACTS["redis proxies"]
    table = contract_table(c, snap.topology, CATALOG)
    tt = tick_table(snap, path_table(snap, snap.thresholds, None), table)
    rng = np.random.default_rng(11)
    rows = tt.block[rng.choice(len(snap.topology.gpus), 8, replace=False)].tolist()
    memo: list = [None] * 8
    reserved = [0.0] * 8
    budget_bound = 0
    for step in range(60):
        reserved[int(rng.integers(8))] += float(rng.choice([0.0, 0.05, 0.3]))
        limit = float(rng.choice([0.2, 0.05])) if step < 30 else float(rng.uniform(0.001, 0.5))
        kept = scalar_figures(tt.layout, rows, reserved, table.flops, limit, 2.0, memo)
        fresh = scalar_figures(tt.layout, rows, reserved, table.flops, limit, 2.0)
        assert kept == fresh, step
        budget_bound += kept.fail.count(ORDER.index(Constraint.LATENCY_BUDGET))
    assert all(m is not None and m[0] == res for m, res in zip(memo, reserved))  # the latest reservation only
    assert budget_bound > 0  # the budget check ran on remembered rows too, and bound somewhere


def test_refresher_warms_the_tables_the_previous_tick_used() -> None:
    sim, r = _world()
    placer = Placer(r)
    assert isinstance(placer.place(instances(sim), 0.2, contract(services=(redis(proxy="dedicated"),)),
                                   ingress="ingress/us-west"), PlacementPlan)
    used = {k: v.dependency_keys() for k, v in r.current().tables.items()}
    nxt = r.tick()
    assert {k: v.dependency_keys() for k, v in nxt.tables.items() if k in used} == used
    assert (nxt.thresholds, None) in nxt.tables  # the default tables are always there
    assert path_table(nxt, nxt.thresholds, None) is nxt.tables[(nxt.thresholds, None)]


def test_reasons_are_written_on_first_read_from_the_snapshot_of_the_choice() -> None:
    sim, r = _world()
    placer = Placer(r)
    plan = placer.place(instances(sim), 0.2, contract(services=(redis(proxy="dedicated"),)))
    assert isinstance(plan, PlacementPlan)
    assert repr(plan.explanation) == "Explanation(pending)"
    for _ in range(3):  # later ticks do not change what the plan says about its own tick
        r.tick()
    reasons = plan.reasons
    assert reasons[0].startswith(f"chose {plan.gpu_key}") and any("dedicated" in x for x in reasons)
    assert any(x.startswith("rejected: ") for x in reasons) and plan.rejected
    assert plan.reasons is reasons and repr(plan.explanation) == "Explanation(written)"
    dup = copy.deepcopy(plan)
    assert dup.reasons == reasons and dup.rejected == plan.rejected and dup == plan


def test_an_explanation_can_be_given_already_written() -> None:
    e = Explanation.of(("why",), ())
    assert e.resolve() == (("why",), ()) and repr(e) == "Explanation(written)"


def test_reservations_within_a_tick_spread_a_burst_and_reset_on_the_next() -> None:
    sim = SimulatedCluster(5, 4, 2, hosts_per_rack=4, noise=0.0)
    r = Refresher(sim, thresholds=Thresholds())
    r.tick()
    placer = Placer(r)
    cands = instances(sim)
    chosen = [placer.place(cands, 0.2, contract(flops=8e12), affinity_key=f"k{i}") for i in range(80)]
    plans = [p for p in chosen if isinstance(p, PlacementPlan)]
    assert len({p.gpu_key for p in plans}) > 1
    assert not all(isinstance(p, PlacementPlan) for p in chosen)  # the tick's free share runs out
    r.tick()
    assert isinstance(placer.place(cands, 0.2, contract(flops=8e12)), PlacementPlan)


def test_a_share_refusal_counts_the_share_placed_since_the_snapshot() -> None:
    """The detail of a GPU_SHARE rejection names the share left after this tick's
    placements, not the snapshot's, so the two numbers it prints disagree the right way."""
    import re

    from policyc.placer.plan import Constraint, NoPlacement

    sim = SimulatedCluster(5, 4, 2, hosts_per_rack=4, noise=0.0)
    r = Refresher(sim, thresholds=Thresholds())
    r.tick()
    placer = Placer(r)
    cands = instances(sim)
    refusals = [p for p in (placer.place(cands, 0.2, contract(flops=8e12), affinity_key=f"k{i}") for i in range(80))
                if isinstance(p, NoPlacement)]
    shares = [x for p in refusals for x in p.rejected if x.constraint is Constraint.GPU_SHARE]
    assert shares, "the tick's free share runs out"
    for x in shares:
        m = re.fullmatch(r"free share (-?[\d.]+) < required ([\d.]+)(?: \(([\d.]+) free on the snapshot, ([\d.]+) placed since\))?", x.detail)
        assert m, x.detail
        left, required = float(m[1]), float(m[2])
        assert left < required
        if m[3] is not None:
            assert abs(float(m[3]) - float(m[4]) - left) < 2e-3
    assert any("placed since" in x.detail for x in shares)
