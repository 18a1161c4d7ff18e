"""The fleet-scale fast paths keep the reference meaning, on fleets shaped like a platform
team's (`tests/fleet_shapes.py`: a contract per family and SLO, the four request kinds).

- Generated fleets, registry changes and requests: `match` (k = 1, a few, all; distinct
  GPUs or not) and `matches` equal the naive scan, with the thresholds of the fast paths
  (prefix blocks, gathered best-k, the empty-tier guard, rank renumbering) lowered so that
  fleets of a few hundred instances go through every one of them.
- The prefix bitmaps of a range attribute equal a sort-and-filter after any mix of adds,
  removes, new values and vanished values.
- Requests of one reduced shape share a plan; a new distinct value makes a new one.
- Best candidate through a base's threshold ranks (`threshold_ranks.py`), for each ordering
  the latency rule may use, equals the naive scan on the request that builds the ranks, on
  those after, and after changes that make them stale (members, tiers, distinct values).
- New bases share their rules by rule shape only: a guard-tested value gets its own.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numpy as np

from policyc.matcher import Registry, Request, attributes, naive_match
from policyc.matcher.result import FORMS
from policyc.matcher import prefix_bitmaps, ranking, threshold_ranks
from policyc.matcher.attribute_index import AttributeIndex
from pyroaring import BitMap

from fleet_shapes import KINDS, make_fleet, request_headers

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every fast path at the size of a test fleet."""
    monkeypatch.setattr(ranking, "SMALL", 2)
    monkeypatch.setattr(ranking, "SMALL_ONE", 3)
    monkeypatch.setattr(ranking, "DIRECT", 12)
    monkeypatch.setattr(ranking, "DIRECT_MANY", 12)
    monkeypatch.setattr(ranking, "EMPTY_TIERS", 2)
    monkeypatch.setattr(ranking, "TARGET", 2)
    monkeypatch.setattr(ranking, "RANK_GAP", 2.0 ** -1060)  # subnormal gaps: splits soon find no room
    monkeypatch.setattr(prefix_bitmaps, "DIRECT", 2)
    monkeypatch.setattr(prefix_bitmaps, "MEMO", 3)
    monkeypatch.setattr(threshold_ranks, "FEW", 1)  # the best tier's slots walked by group, not filtered
    yield


def naive_order(reg: Registry, q_vars: dict, k: int) -> tuple[tuple[str, ...], frozenset[str], tuple[str, ...]]:
    bundle = reg.bundle
    entries = [(inst, attributes(inst, bundle.contract(inst.model), bundle), score) for inst, _, score in reg.entries()]
    want = naive_match(bundle, entries, q_vars, max(k, len(entries)))
    by_id = {inst.id: inst for inst, _, _ in entries}
    firsts: list[str] = []
    taken: set[tuple[str, str, str]] = set()
    for iid in want.best:
        d = by_id[iid].deployment
        if (by_id[iid].model, d.host, d.gpu) not in taken:
            taken.add((by_id[iid].model, d.host, d.gpu))
            firsts.append(iid)
    return want.best, want.ids, tuple(firsts)


def churn(reg: Registry, rng: random.Random, gone: list) -> None:
    """One random change: an instance removed (kept in `gone`), one of `gone` added back, or
    two score moves, within a tier (ranks kept) or across tiers (ranks stale)."""
    insts = [e[0] for e in reg.entries()]
    r = rng.random()
    if r < 0.3 and insts:
        victim = rng.choice(insts)
        reg.remove(victim.id)
        gone.append(victim)
    elif r < 0.5 and gone:
        reg.add(gone.pop(), rng.random())
    elif insts:
        reg.set_scores([(rng.choice(insts).id, rng.choice((0.0, 1.0, rng.random()))) for _ in range(2)])


def agrees(reg: Registry, headers: dict[str, str]) -> None:
    q = reg.parse_request(headers)
    order, ids, firsts = naive_order(reg, dict(q.vars), len(reg))
    for k in (1, 4, len(order) + 1):
        got = reg.match(q, k)
        assert got.count == len(ids), headers
        assert tuple(s.instance.id for s in got.best) == order[:k], (headers, k)
        got_d = reg.match(q, k, distinct_gpus=True)
        assert tuple(s.instance.id for s in got_d.best) == firsts[:k], (headers, k)
    every = reg.matches(q)
    assert every.count == len(ids) and {i.id for i in every.instances} == ids
    assert every.rules == reg.match(q, 1).rules
    forms_agree(reg, q, ids)


def forms_agree(reg: Registry, q: Request, ids: frozenset[str]) -> None:
    """Every answer form of `matches`, and `admits` on every instance, equal the naive scan."""
    rules = reg.match(q, 1).rules
    forms = {f: reg.matches(q, f) for f in FORMS}
    for f, got in forms.items():
        assert got.form == f and got.count == len(ids) and got.rules == rules, f
    bitmap, slots, id_arr = forms["bitmap"].bitmap, forms["slots"].slots, forms["ids"].ids
    assert bitmap is not None and slots is not None and id_arr is not None
    assert slots.dtype == np.uint32 and list(slots) == sorted(slots.tolist()) == list(bitmap)
    assert id_arr.dtype == object and len(id_arr) == len(ids) and set(id_arr.tolist()) == ids
    assert forms["id_set"].id_set == ids
    insts = forms["instances"].instances
    assert insts is not None and {i.id for i in insts} == ids
    assert [i.id for i in insts] == id_arr.tolist()  # one order: the slots'
    for iid in [e[0].id for e in reg.entries()]:
        assert reg.admits(q, iid) == (iid in ids), (iid, dict(q.vars))


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(1, 300), families=st.integers(1, 4),
       levels=st.sampled_from((0, 1, 2, 3)), churn=st.integers(0, 12), reqs=st.integers(1, 8))
def test_generated_fleets_equal_naive_scan(small_thresholds: None, seed: int, n: int, families: int, levels: int,
                                           churn: int, reqs: int) -> None:
    fleet = make_fleet(n, seed, families=families, score_levels=levels)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, shard_size=8)
    rng = random.Random(seed)
    headers = [request_headers(KINDS[i % 4], rng, families) for i in range(reqs)]
    for h in headers:
        agrees(reg, h)
    gone = []
    for step in range(churn):  # removals, re-additions and score moves, every request re-checked
        insts = [e[0] for e in reg.entries()]
        if insts and rng.random() < 0.5:
            victim = rng.choice(insts)
            reg.remove(victim.id)
            gone.append(victim)
        elif gone:
            reg.add(gone.pop(rng.randrange(len(gone))), rng.random())
        insts = [e[0] for e in reg.entries()]
        if insts:
            reg.set_scores([(rng.choice(insts).id, rng.choice((0.0, 0.5, 1.0, rng.random()))) for _ in range(3)])
        agrees(reg, headers[step % len(headers)])


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(1, 250), cmp=st.sampled_from(("<", "<=", ">", ">=")),
       levels=st.sampled_from((0, 2)), steps=st.integers(1, 10))
def test_threshold_ranks_equal_naive_scan(small_thresholds: None, seed: int, n: int, cmp: str, levels: int,
                                          steps: int) -> None:
    fleet = make_fleet(n, seed, families=2, score_levels=levels, latency_cmp=cmp)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, shard_size=8)
    rng = random.Random(seed)
    slos = sorted({c.slo.latency for c in fleet.bundle.contracts if c.slo})
    gone = []
    for step in range(steps):
        h = request_headers(KINDS[step % 4], rng, 2)
        # three targets for one base: the first request since a change answers from the base's
        # bitmap, the next builds its ranks; at a value, just past one, or anywhere
        for target in (rng.choice(slos) * 1e3, rng.choice(slos) * 1e3 + 0.01, rng.uniform(30, 520)):
            h["X-SLO-Latency"] = f"{target:.2f}ms"
            q = reg.parse_request(h)
            order, ids, _ = naive_order(reg, dict(q.vars), 1)
            for _ in range(2):  # the second time from the answer cache
                got = reg.match(q, 1)
                assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:1], (h, cmp)
        churn(reg, rng, gone)
    assert reg.index.rank_misses == 0


def test_threshold_ranks_answer_new_shapes() -> None:
    """On the benchmark's fleet shape, a base's second request is answered by its ranks (no
    plan is made) and every answer equals the naive scan."""
    fleet = make_fleet(3_000, 5)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    rng = random.Random(6)
    ix = reg.index
    for kind in KINDS:
        h = request_headers(kind, rng)
        for slo in ("120.25ms", "260.5ms", "260.5ms"):
            h["X-SLO-Latency"] = slo
            q = reg.parse_request(h)
            order, ids, _ = naive_order(reg, dict(q.vars), 1)
            got = reg.match(q, 1)
            assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:1], kind
    assert len(ix.reduced) == 0 and len(ix.plans) == 0  # k = 1 never planned
    ranked = [b for b in ix.bases._plans.values() if b.ranks is not None]
    assert len(ranked) == len(KINDS) and ix.rank_misses == 0


def test_the_benchmark_fleet_shape() -> None:
    """At a fifth of the benchmark's size: about 4.5 instances per contract, every
    contract (family, SLO) distinct while they last, the four kinds parse."""
    fleet = make_fleet(20_000, 3)
    assert len(fleet.instances) == 20_000
    assert 4_000 <= len(fleet.bundle.contracts) <= 4_600
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    rng = random.Random(4)
    for kind in KINDS:
        q = reg.parse_request(request_headers(kind, rng))
        assert reg.match(q, 1).count == reg.matches(q).count
    flags = [i.deployment.tpm for i in fleet.instances]
    assert 0.4 < sum(flags) / len(flags) < 0.6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.sampled_from((0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 1.0, 2.0))
                              | st.integers(0, 60).map(lambda x: x / 20)), max_size=120),
       probes=st.lists(st.floats(0, 3.5), min_size=1, max_size=6))
def test_prefix_bitmaps_equal_a_filter(small_thresholds: None, ops: list, probes: list) -> None:
    idx = AttributeIndex("slo_latency", ordered=True)
    held: dict[int, float] = {}
    for add, slot, value in ops:
        if add and slot not in held:
            idx.add(slot, value)
            held[slot] = value
        elif not add and slot in held:
            idx.remove(slot, held.pop(slot))
        for x in probes + [value]:
            for cmp, holds in (("<", float.__lt__), ("<=", float.__le__), (">", float.__gt__), (">=", float.__ge__)):
                want = {s for s, v in held.items() if holds(float(v), float(x))}
                assert set(idx.order(cmp, x)) == want, (cmp, x, sorted(held.items()))
        pos = idx.key_positions()  # rebuilt after a new or vanished value, else kept per update
        assert {s: idx.keys[pos[s] - 1] for s in range(len(pos)) if pos[s]} == held  # counted from one


def test_requests_of_one_reduced_shape_share_a_plan() -> None:
    """Best-k for k > 1 (and all matches) plans per reduced shape."""
    fleet = make_fleet(400, 9, families=2)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    slos = sorted({c.slo.latency for c in fleet.bundle.contracts if c.slo})
    lo, hi = slos[3], slos[4]
    plans = reg.index.reduced
    first = reg.match(reg.parse_request({"X-SLO-Latency": f"{(lo + (hi - lo) / 3) * 1e3:.4f}ms"}), 3)
    size = len(plans)
    again = reg.match(reg.parse_request({"X-SLO-Latency": f"{(lo + 2 * (hi - lo) / 3) * 1e3:.4f}ms"}), 3)
    assert len(plans) == size and again.count == first.count  # between the same two values: one plan
    reg.match(reg.parse_request({"X-SLO-Latency": f"{hi * 1e3:.4f}ms"}), 3)
    assert len(plans) == size + 1  # at a value: another position


def test_a_shared_plan_is_not_reused_across_a_new_value() -> None:
    """Two targets between the same two values share a plan; once a value appears between
    them, the second target is planned again (it was answered as the first: 31 instead of
    23 on this fleet)."""
    fleet = make_fleet(300, 3, families=2)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    by_slo: dict[float, list] = {}
    for inst in fleet.instances:
        by_slo.setdefault(reg.bundle.contract(inst.model).slo.latency, []).append(inst)
    slo = sorted(by_slo)[5]
    for inst in by_slo[slo]:
        reg.remove(inst.id)

    def agree(target_ms: float) -> None:
        q = reg.parse_request({"X-SLO-Latency": f"{target_ms:.4f}ms"})
        order, ids, _ = naive_order(reg, dict(q.vars), 3)
        for k in (3, 1):
            got = reg.match(q, k)
            assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:k], (target_ms, k)
        assert reg.matches(q).count == len(ids)

    agree(slo * 1e3 + 0.3)
    agree(slo * 1e3 - 0.2)  # the same gap: the first one's plan
    for inst in by_slo[slo]:
        reg.add(inst, 0.5)
    agree(slo * 1e3 - 0.2)  # now below the value that came back


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), n=st.integers(1, 120), bands=st.integers(1, 6))
def test_tier_ranks_follow_splits_and_renumbering(small_thresholds: None, seed: int, n: int, bands: int) -> None:
    """Groups crowding into a few score bands split the same tiers again and again, until
    no float is left between two ranks and the tiers are renumbered; best-k through the
    gathered ranks still equals sorting by (-score, group, id)."""
    rng = random.Random(seed)
    tiers = ranking.ScoreTiers()
    for s in range(n):
        tiers.add(s, f"i{s:03d}", ("m", f"h{s % 40:02d}", f"g{s % 3}"), -rng.random())
    for _ in range(6):
        names = list(tiers.groups)
        rng.shuffle(names)
        tiers.move_many([(name, -(rng.randrange(bands) + rng.random() * 1e-9)) for name in names[: len(names) // 2 + 1]])
    live = list(range(n))
    for _ in range(10):
        cand = BitMap(rng.sample(live, rng.randint(1, n)))
        order = sorted(cand, key=tiers.order_key)
        for k in (1, 3, n):
            assert tiers.best(cand, len(cand), k) == order[:k]
            firsts, seen = [], set()
            for s in order:
                if tiers.group_of[s].name not in seen:
                    seen.add(tiers.group_of[s].name)
                    firsts.append(s)
            assert tiers.best_distinct(cand, len(cand), k) == firsts[:k]


def test_ranks_renumber_when_a_gap_runs_out(small_thresholds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new group is the best so far: tier 0 splits every few additions, halving the
    same gap until it is gone."""
    renumbered = []
    real = ranking.ScoreTiers._renumber
    monkeypatch.setattr(ranking.ScoreTiers, "_renumber", lambda self: (renumbered.append(1), real(self))[1])
    tiers = ranking.ScoreTiers()
    for s in range(80):
        tiers.add(s, f"i{s:03d}", ("m", f"h{s:03d}", "g0"), -float(s))
    ranks = [t.rank for t in tiers.tiers]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert renumbered
    cand = BitMap(range(0, 80, 7))
    assert tiers.best(cand, len(cand), 3) == [77, 70, 63]
    assert all(tiers.rank_of[s] == tiers.group_of[s].tier.rank for s in range(80))


def test_unread_variables_share_a_base() -> None:
    """Requests that differ only in a variable no rule reads (the tenant's name, where the
    rules read its class) share one base and one plan of their reduced shape, for k = 1 and
    for k > 1, and each equals the naive scan; a variable a rule reads (the class) still
    gets a base of its own."""
    fleet = make_fleet(1_500, 11)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores)
    ix = reg.index
    assert ix._unread == ("max_tokens", "prompt_tokens", "stream", "tenant")  # the LLM body's variables: no rule here reads them
    fixed = {"region": "eu-west", "need_tpm": True}
    for tenant, cls in (("anonymous", "public"), ("beta-co", "public"), ("gamma-co", "public"), ("acme-bank", "finance")):
        q = Request.of({**fixed, "slo": 0.2, "tenant": tenant, "tenant_class": cls})
        for k in (1, 3):
            order, ids, _ = naive_order(reg, dict(q.vars), k)
            got = reg.match(q, k)
            assert got.count == len(ids) and tuple(s.instance.id for s in got.best) == order[:k], (tenant, k)
        assert len(ix.bases) == (1 if cls == "public" else 2), tenant
    assert len(ix.reduced) == 2  # k = 3 is planned: one plan per class


def test_new_bases_share_rules_by_rule_shape() -> None:
    """A new base looks its rules up by which read variables are present and the values the
    guards compare (`FleetIndex._rule_shape`): a guard-tested value (TPM required or not,
    the tenant's class) gets rules of its own, a value only a requirement reads (the
    region) shares them; every answer, and the rules it names, equal the naive scan."""
    fleet = make_fleet(800, 13, families=2)
    reg = Registry(fleet.bundle, fleet.instances, fleet.scores, prebuild=False)  # bases made by requests only
    ix = reg.index
    fixed = {"X-SLO-Latency": "250.5ms", "X-Data-Region": "us-west"}
    shapes = []
    for extra in ({}, {"X-Require-TPM": "yes"}, {"X-Require-TPM": "no"}, {"X-Data-Region": "eu-west"},
                  {"X-Tenant": "acme-bank"}, {"X-Require-TPM": "yes", "X-Data-Region": "ap-east"}):
        q = reg.parse_request({**fixed, **extra})
        want = naive_match(reg.bundle, reg.entries(), dict(q.vars), 1)
        got = reg.match(q, 1)
        assert got.count == len(want.ids) and tuple(s.instance.id for s in got.best) == want.best, extra
        assert tuple(r.id for r in got.rules) == want.rules, extra
        shapes.append(len(ix._shapes))
    assert shapes == [1, 2, 3, 3, 4, 4]  # a new region reuses its shape; a flag's value or a class does not
