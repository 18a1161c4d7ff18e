"""What the request path remembers between requests (candidate rows per instance object,
candidate sets and their gathers per tick table, per-(tick, contract) tables warmed by the
refresher) changes its cost, never its answer."""

from __future__ import annotations

import time

import numpy as np
import pytest
from placer_support import contract, instances, redis, replay

from policyc.matcher.instance import Deployment, Instance
from policyc.placer import NoPlacement, PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.candidate_rows import CandidateRows
from policyc.placer.candidate_sets import CandidateSets
from policyc.placer.paths import path_table
from policyc.placer.tick_table import tick_table


def _fresh_rows(topology, candidates):
    """The rows found the plain way, for comparison."""
    rows, known, unknown = [], [], []
    for x in candidates:
        i = topology.gpu_index.get((x.deployment.host, x.deployment.gpu))
        (unknown if i is None else known).append(x)
        if i is not None:
            rows.append(i)
    return rows, known, unknown


def test_rows_are_the_topology_rows_and_unknown_gpus_are_kept_apart() -> None:
    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    t = sim.topology()
    cands = instances(sim)
    ghost = Instance(id="ghost", model="recommender",
                     deployment=cands[0].deployment.model_copy(update={"host": "host-9999"}))
    mixed = [cands[5], ghost, cands[2], cands[5], cands[9]]
    memo = CandidateRows()
    for _ in range(3):  # first call fills the memo, later ones read it
        assert memo.rows(t, mixed) == _fresh_rows(t, mixed)
    rows, known, unknown = memo.rows(t, mixed)
    assert unknown == [ghost] and known[1] is cands[2] and len(rows) == 4


def test_an_equal_but_distinct_instance_object_is_looked_up_afresh() -> None:
    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    t = sim.topology()
    a = instances(sim)[4]
    memo = CandidateRows()
    memo.rows(t, [a])
    moved = Instance(id=a.id, model=a.model, deployment=Deployment(**{**a.deployment.model_dump(), "gpu": "gpu0"}))
    assert memo.rows(t, [moved])[0] == [t.gpu_index[(a.deployment.host, "gpu0")]]
    assert memo.rows(t, [a])[0] == [t.gpu_index[(a.deployment.host, a.deployment.gpu)]]


def test_the_memo_starts_over_for_a_new_topology_and_at_its_limit() -> None:
    one, two = SimulatedCluster(3, 8, 4, hosts_per_rack=4), SimulatedCluster(4, 4, 2, hosts_per_rack=4)
    cands = instances(one)
    memo = CandidateRows(limit=5)
    assert memo.rows(one.topology(), cands) == _fresh_rows(one.topology(), cands)  # 32 instances through a memo of 5
    assert memo.rows(two.topology(), cands) == _fresh_rows(two.topology(), cands)  # hosts 4-7 are not in `two`


def test_past_its_limit_each_memo_lets_go_of_its_oldest_entry_only() -> None:
    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    t = sim.topology()
    cands = instances(sim)
    sets = CandidateSets(limit=3)
    a, b, c = (sets.get(t, tuple(cands[i:i + 2])) for i in (0, 2, 4))
    d = sets.get(t, tuple(cands[6:8]))  # a fourth set: the oldest (a) goes, b and c stay
    assert sets.get(t, tuple(cands[2:4])) is b and sets.get(t, tuple(cands[4:6])) is c
    assert sets.get(t, tuple(cands[6:8])) is d
    assert sets.get(t, tuple(cands[0:2])) is not a  # built afresh, and now b is the oldest
    assert sets.get(t, tuple(cands[4:6])) is c and sets.get(t, tuple(cands[2:4])) is not b
    rows = CandidateRows(limit=4)
    for i in range(len(cands)):  # one instance at a time through a memo of 4
        assert rows.rows(t, [cands[i]]) == _fresh_rows(t, [cands[i]])
        assert len(rows._memo[1]) == min(i + 1, 4) and list(rows._memo[1])[-1] == id(cands[i])


def test_a_candidate_set_is_remembered_only_while_the_same_objects_come_back() -> None:
    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    t = sim.topology()
    cands = instances(sim)
    sets = CandidateSets()
    first = sets.get(t, tuple(cands[:6]))
    assert sets.get(t, tuple(cands[:6])) is first  # a new tuple of the same objects: the same set
    assert sets.get(t, cands[:6]) is first  # a list of them too
    rows, known = _fresh_rows(t, cands[:6])[:2]
    assert first.rows == tuple(rows) and first.known == known and tuple(first.gpus.tolist()) == first.rows
    other = sets.get(t, tuple(reversed(cands[:6])))  # order matters: the rows are the candidates' rows
    assert other is not first and other.rows == first.rows[::-1]
    a = cands[0]
    copy = Instance(id=a.id, model=a.model, deployment=Deployment(**{**a.deployment.model_dump(), "gpu": "gpu1"}))
    moved = sets.get(t, (copy, *cands[1:6]))  # equal id, another object: looked up afresh
    assert moved is not first and moved.rows[0] == t.gpu_index[(a.deployment.host, "gpu1")]
    ghost = Instance(id="ghost", model=a.model, deployment=a.deployment.model_copy(update={"host": "host-9999"}))
    with_ghost = sets.get(t, (ghost, a))
    assert with_ghost.known == [a] and [x.gpu for x in with_ghost.unknown] == ["ghost"]
    assert "host-9999" in with_ghost.unknown[0].detail
    two = SimulatedCluster(4, 4, 2, hosts_per_rack=4)
    assert sets.get(two.topology(), tuple(cands[:6])).topology is two.topology()  # a new topology: afresh


def _one_tick():  # type: ignore[no-untyped-def]
    """A refresher after its first tick, a placer on it, a contract and eight candidates."""
    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    r = Refresher(sim)
    snap = r.tick()
    return r, snap, Placer(r), contract(), tuple(instances(sim)[:8])


def test_a_candidate_set_gathers_each_tick_table_once() -> None:
    r, snap, placer, c, cands = _one_tick()
    assert isinstance(placer.place(cands, 0.2, c), PlacementPlan)
    cs = placer._sets.get(snap.topology, cands)
    tt = next(iter(snap.tables[(snap.thresholds, None)].contracts.values()))
    got = cs.gather(tt)
    assert cs.gather(tt) is got  # kept for the tick
    np.testing.assert_array_equal(got.g, tt.block[cs.gpus])
    assert got.rows == tuple(map(tuple, got.g.tolist()))
    nxt = r.tick()
    assert isinstance(placer.place(cands, 0.2, c), PlacementPlan)
    tt2 = next(iter(nxt.tables[(nxt.thresholds, None)].contracts.values()))
    assert cs.gather(tt2) is not got  # a new tick: gathered afresh


def test_a_candidate_set_looks_its_tick_table_up_once_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next request of a set on the same tick skips the path and tick table look-ups
    (the set remembers which tables it gathered); a new tick, other thresholds (a stale
    snapshot's conservative ones are a new object each time) or another contract table
    look them up again, and the plans are a fresh placer's."""
    import policyc.placer.candidate_sets as cs_module

    calls: list[object] = []
    real = cs_module.path_table
    monkeypatch.setattr(cs_module, "path_table", lambda snap, th, node: calls.append(th) or real(snap, th, node))
    r, snap, placer, c, cands = _one_tick()
    for _ in range(3):
        assert isinstance(placer.place(cands, 0.2, c), PlacementPlan)
    assert len(calls) == 1
    cs = placer._sets.get(snap.topology, cands)
    tt, got = cs.gathered(snap, snap.thresholds, None, placer._contract_table(c, snap.topology))
    assert tt is tick_table(snap, path_table(snap, snap.thresholds, None), placer._contract_table(c, snap.topology))
    assert got is cs.gather(tt) and len(calls) == 1
    nxt = r.tick()
    assert isinstance(placer.place(cands, 0.2, c), PlacementPlan) and len(calls) == 2  # a new tick
    assert isinstance(placer.place(cands, 0.2, contract(services=(redis(),))), PlacementPlan) and len(calls) == 3
    late = Placer(r, clock=lambda: time.monotonic() + 10.0)  # the snapshot is stale to it: conservative thresholds,
    plans = [late.place(cands, 0.2, c) for _ in range(2)]  # a new object per request
    assert len(calls) == 5 and calls[-1] is not calls[-2] and calls[-1] == nxt.thresholds.conservative()
    fresh = Placer(r, clock=lambda: time.monotonic() + 10.0).place(cands, 0.2, c)
    assert [type(p) for p in plans] == [type(fresh)] * 2 and plans[0].stale and fresh.stale
    if isinstance(fresh, PlacementPlan):
        assert isinstance(plans[0], PlacementPlan) and (plans[0].gpu_key, plans[0].share) == (fresh.gpu_key, fresh.share)


def test_a_candidate_set_no_longer_asked_for_does_not_keep_its_last_tick_table_alive() -> None:
    """The memo keeps sets that stopped recurring (a re-ranked shape hands the placer other
    candidates) until it starts over; their last gathers must not pin that tick's tables,
    or a busy server grows by megabytes a second. A plan placed on the table keeps it for
    its explanation."""
    import gc
    import weakref

    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    r = Refresher(sim)
    snap = r.tick()
    placer = Placer(r)
    cands = tuple(instances(sim)[:8])
    plan = placer.place(cands, 0.2, contract())
    assert isinstance(plan, PlacementPlan)
    tt = weakref.ref(next(iter(snap.tables[(snap.thresholds, None)].contracts.values())))
    del snap
    for _ in range(3):  # later ticks: the refresher keeps only the latest snapshots
        r.tick()
    others = tuple(instances(sim)[8:16])  # the shape now gets other candidates
    assert isinstance(placer.place(others, 0.2, contract()), PlacementPlan)
    gc.collect()
    assert tt() is not None  # the first plan's explanation still reads it
    reasons = plan.reasons
    del plan
    gc.collect()
    assert tt() is None and reasons  # the first set is still remembered, and holds its table weakly
    assert len(placer._sets._sets) == 2


def test_a_refused_candidate_set_is_refused_in_the_same_words_until_its_shares_or_the_tick_move() -> None:
    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    r = Refresher(sim)
    r.tick()
    placer = Placer(r)
    c = contract(flops=4e13)  # a request needs a large share: three GPUs run out within the tick
    few = tuple(instances(sim)[:3])
    plans = [placer.place(few, 0.2, c) for _ in range(60)]  # reserve share until none is left this tick
    refusals = [p for p in plans if isinstance(p, NoPlacement)]
    assert len(refusals) >= 2 and refusals[0].binding.value in ("gpu_share", "latency_budget")
    assert all(x is refusals[0] for x in refusals[1:])  # written once, handed on
    fresh = Placer(r)  # the same reservations made afresh give the same words
    fresh._reserved, fresh._reserved_version = list(placer._reserved), placer._reserved_version
    again = fresh.place(few, 0.2, c)
    assert again == refusals[0] and again is not refusals[0]
    elsewhere = placer.place(tuple(instances(sim)[3:5]), 0.2, c)  # a share placed on other GPUs changes nothing here
    assert isinstance(elsewhere, PlacementPlan) and placer.place(few, 0.2, c) is refusals[0]
    small = placer.place(few[:1], 0.2, contract(flops=1e11))  # a small request still fits on one of its GPUs
    assert isinstance(small, PlacementPlan)
    after = placer.place(few, 0.2, c)
    assert isinstance(after, NoPlacement) and after is not refusals[0] and after != refusals[0]  # written afresh
    r.tick()
    assert placer.place(few, 0.2, c) is not refusals[0]  # a new tick: placed (or refused) afresh


def test_the_refresher_warms_the_contract_tables_the_previous_tick_used() -> None:
    sim = SimulatedCluster(11, 16, 4, hosts_per_rack=4)
    r = Refresher(sim)
    r.tick()
    placer = Placer(r)
    c = contract(services=(redis(proxy="dedicated"),))
    assert isinstance(placer.place(instances(sim)[:8], 0.2, c, ingress="ingress/us-west"), PlacementPlan)
    used = [(key, list(pt.contracts)) for key, pt in r.current().tables.items() if pt.contracts]
    assert used
    nxt = r.tick()
    for key, tables in used:
        pt = nxt.tables[key]
        assert all(tb in pt.contracts for tb in tables)
        for tb in tables:  # warmed, and what a request would have built itself
            np.testing.assert_array_equal(pt.contracts[tb].block, tick_table(nxt, path_table(nxt, *key), tb).block)
    assert not any(nxt.tables[k].contracts for k in nxt.tables if k not in dict(used))


def test_a_table_no_request_read_is_not_warmed_again() -> None:
    """A moment's staleness makes requests read the conservative tables; the next tick warms
    them, and once a tick passes without a request reading them they are let go, instead
    of being rebuilt every tick ever after."""
    sim = SimulatedCluster(11, 16, 4, hosts_per_rack=4)
    r = Refresher(sim)
    snap = r.tick()
    cautious = (snap.thresholds.conservative(), None)
    c = contract(services=(redis(proxy="dedicated"),))
    Placer(r).place(instances(sim)[:8], 0.2, c)  # reads the default tables
    pt = path_table(snap, *cautious)  # as a request on a stale snapshot does
    table = next(iter(snap.tables[(snap.thresholds, None)].contracts))
    tick_table(snap, pt, table)
    warmed = r.tick()  # read last tick: warmed, with its contract table
    assert cautious in warmed.tables and table in warmed.tables[cautious].contracts
    assert (warmed.thresholds, None) in warmed.tables and table in warmed.tables[(warmed.thresholds, None)].contracts
    assert warmed.used == set()  # warming is not reading
    after = r.tick()  # nobody read them on `warmed`: let go (the default table is always built)
    assert cautious not in after.tables and set(after.tables) == {(after.thresholds, None)}
    assert not after.tables[(after.thresholds, None)].contracts


def test_plans_with_the_memos_are_the_plans_without_them() -> None:
    """The same requests through a placer that keeps its memos and through ones that start
    afresh for every request (bursts, sticky keys, sessions, refusals) give the same plans."""

    def forget(placer: Placer, refresher: Refresher) -> None:
        placer._sets = CandidateSets()
        for pt in refresher.current().tables.values():
            pt.contracts.clear()

    def run(fresh: bool) -> list:
        return replay(90, budget=lambda i: 0.005 if i % 7 == 0 else 0.2,  # some requests no GPU can serve in time
                      before_each=forget if fresh else lambda placer, refresher: None)

    kept, fresh = run(False), run(True)
    assert kept == fresh
    assert any(isinstance(x, NoPlacement) for x in kept) and sum(isinstance(x, tuple) for x in kept) > 40


def test_a_rows_plan_parts_are_written_once_a_tick_and_equal_a_fresh_placers() -> None:
    """What a plan states about its GPU apart from the share-dependent figures (where the GPU
    is, its probes, dependency bindings, round trip, spread, share) is written by the first
    plan placed on that row in a tick and read by the ones after; a new tick writes it
    afresh. Plans (every compared field) equal those of a placer that forgets its memos
    before every request, across ticks."""
    from policyc.placer.evaluated import RowFixed

    def forget(placer: Placer, refresher: Refresher) -> None:
        placer._sets = CandidateSets()
        placer._sites = type(placer._sites)()
        for pt in refresher.current().tables.values():
            pt.contracts.clear()

    sim = SimulatedCluster(3, 8, 4, hosts_per_rack=4)
    r = Refresher(sim)
    snap = r.tick()
    kept, fresh = Placer(r), Placer(r)
    c = contract(services=(redis(proxy="dedicated"),))
    cands = tuple(instances(sim)[:8])
    plans = []
    for i in range(40):
        if i and i % 10 == 0:
            snap = r.tick()
            cs = kept._sets.get(snap.topology, cands)
            tt, got = cs.gathered(snap, snap.thresholds, None, kept._contract_table(c, snap.topology))
            assert got.fixed == [None] * len(got.fixed)  # a new tick: nothing written yet
        a = kept.place(cands, 0.2, c, affinity_key=f"k{i % 3}")
        forget(fresh, r)
        b = fresh.place(cands, 0.2, c, affinity_key=f"k{i % 3}")
        assert isinstance(a, PlacementPlan) and a == b and a.reasons == b.reasons
        plans.append(a)
    assert any(p.dependencies for p in plans) and all(any(x.startswith("dependency_p99:") for x in p.probes) for p in plans)
    cs = kept._sets.get(snap.topology, cands)
    tt, got = cs.gathered(snap, snap.thresholds, None, kept._contract_table(c, snap.topology))
    written = [k for k in got.fixed if k is not None]
    assert written and all(isinstance(k, RowFixed) for k in written)
    same_row = [p for p in plans[30:] if p.gpu_key == plans[30].gpu_key]
    assert len(same_row) >= 2 and all(p.probes is same_row[0].probes for p in same_row)  # read, not written again
