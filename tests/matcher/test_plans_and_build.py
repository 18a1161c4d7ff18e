"""The fast paths keep the reference meaning.

- Cached request-shape plans are never stale: requests are re-checked against the naive
  scan after every registry change, with the plan cache off, tiny (evicting) and normal.
- The bulk build's shortcuts (attributes per deployment signature, slots a placement group
  at a time, score tiers from sorted triples) equal their one-at-a-time definitions.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.compiler.bundle import Bundle
from policyc.matcher import AdmissionError, Registry, Request, attributes, naive_match
from policyc.matcher.admission_cache import AdmissionCache
from policyc.matcher.ranking import ScoreTiers
from policyc.matcher.slots import SlotAllocator

from matcher_support import admissible
from test_differential import apply, ops, requests, typed

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def step(reg: Registry, bundle: Bundle, op: tuple, fresh_id: str) -> None:
    """One registry change of `test_differential.ops` (ids taken modulo the live ids)."""
    ids = sorted(e[0].id for e in reg.entries())
    if op[0] == "add":
        reg.add(admissible(bundle, random.Random(op[1]), fresh_id), score=random.Random(op[1]).random())
    elif ids and op[0] == "remove":
        reg.remove(ids[op[1] % len(ids)])
    elif ids and op[0] == "update":
        reg.update(admissible(bundle, random.Random(op[2]), ids[op[1] % len(ids)]))
    elif ids and op[0] == "score":
        reg.set_score(ids[op[1] % len(ids)], op[2])


def agrees(reg: Registry, bundle: Bundle, req: Request, k: int) -> None:
    entries = [(inst, attributes(inst, bundle.contract(inst.model), bundle), score) for inst, _, score in reg.entries()]
    got = reg.match(req, k)
    want = naive_match(bundle, entries, req.vars, k)
    assert got.count == len(want.ids)
    assert tuple(s.instance.id for s in got.best) == want.best
    assert tuple(r.id for r in got.rules) == want.rules


@SETTINGS
@given(seed=st.integers(0, 2**32), fleet=st.integers(0, 30), script=ops, reqs=st.lists(requests, min_size=1, max_size=4),
       cache=st.sampled_from((0, 2, 512)), k=st.sampled_from((1, 3, 100)))
def test_plans_follow_every_registry_change(shapes_bundle: Bundle, seed: int, fleet: int, script: list, reqs: list,
                                            cache: int, k: int) -> None:
    reg = Registry(shapes_bundle, shard_size=4, plan_cache=cache)
    apply(reg, shapes_bundle, seed, fleet, [])
    typed_reqs = [typed(shapes_bundle, raw) for raw in reqs]
    for req in typed_reqs:
        agrees(reg, shapes_bundle, req, k)
    for n, op in enumerate(script):  # one change at a time, every request re-checked after each
        step(reg, shapes_bundle, op, f"new{n:03d}")
        for req in typed_reqs:
            agrees(reg, shapes_bundle, req, k)
    assert len(reg.index.plans) <= max(cache, 0)


def test_equal_values_share_a_plan_without_changing_answers(shapes_bundle: Bundle) -> None:
    """`True == 1.0` in Python, so both requests use one cached plan; the reference scan
    gives both the same answer too, which is why sharing is sound."""
    reg = Registry(shapes_bundle, shard_size=4)
    apply(reg, shapes_bundle, 5, 40, [])
    for value in (True, 1.0, False, 0.0):
        agrees(reg, shapes_bundle, Request.of({"secure": value}), 5)
    assert len(reg.index.plans) == 2


def test_plan_cache_hits_and_refreshes(policies_bundle: Bundle) -> None:
    reg = Registry(policies_bundle, shard_size=8)
    apply(reg, policies_bundle, 11, 60, [])
    req = Request.of({"model": "fraud-scorer", "tenant": "acme-bank", "tenant_class": "finance"})
    first = reg.match(req, 3)
    plans = reg.index.plans
    hits = plans.hits
    assert reg.match(req, 3) == first and plans.hits == hits + 1
    extra = admissible(policies_bundle, random.Random(3), "extra", model="fraud-scorer")
    reg.add(extra, score=1.0)  # the best candidate now: a stale plan would miss it
    after = reg.match(req, 3)
    assert after.count == first.count + 1 and after.best[0].instance.id == "extra"
    reg.remove("extra")
    assert reg.match(req, 3) == first


@SETTINGS
@given(seed=st.integers(0, 2**32))
def test_attributes_per_signature_equal_attributes(shapes_bundle: Bundle, seed: int) -> None:
    rng = random.Random(seed)
    cache = AdmissionCache(shapes_bundle)
    for n in range(20):
        inst = admissible(shapes_bundle, rng, f"i{n}")
        if rng.random() < 0.3:  # labels that collide with contract labels must win
            inst = inst.model_copy(update={"labels": {**inst.labels, "data": rng.choice(("phi", "public"))}})
        want = attributes(inst, shapes_bundle.contract(inst.model), shapes_bundle)
        assert cache.attributes(inst) == want
        assert cache.attributes(inst) is not cache.attributes(inst)  # a fresh dict each time


def test_admission_refusal_is_cached_and_still_names_each_instance(shapes_bundle: Bundle) -> None:
    cache = AdmissionCache(shapes_bundle)
    inst = admissible(shapes_bundle, random.Random(1), "a", model="fraud-scorer")
    for iid in ("b", "c"):
        bad = inst.model_copy(update={"id": iid, "deployment": inst.deployment.model_copy(update={"tpm": False})})
        try:
            cache.attributes(bad)
        except AdmissionError as e:
            assert e.instance_id == iid and "requires `tpm`" in str(e)
        else:
            raise AssertionError("an inadmissible instance was admitted")


@SETTINGS
@given(script=st.lists(st.tuples(st.sampled_from(("take", "many", "give")), st.integers(0, 3), st.integers(1, 20)),
                       max_size=40))
def test_take_many_equals_repeated_take(script: list) -> None:
    one, many = SlotAllocator(4), SlotAllocator(4)
    held: list[int] = []
    for op, group, n in script:
        if op == "give" and held:
            slot = held.pop(n % len(held))
            one.give(slot)
            many.give(slot)
        elif op != "give":
            count = 1 if op == "take" else n
            want = [one.take(group) for _ in range(count)]
            assert many.take_many(group, count) == want
            held.extend(want)
    assert len(set(held)) == len(held)


def random_tiers(rng: random.Random, n: int, groups: int) -> tuple[ScoreTiers, dict[int, tuple], dict[tuple, float], dict[int, str]]:
    """Tiers over `n` slots in `groups` groups (several members each, as copies of a model
    on one GPU), half built in bulk and half added one by one (splits), then some groups
    moved: the tiers, each slot's group, each group's score and each slot's id."""
    tiers = ScoreTiers()
    group = {s: ("m", f"h{rng.randrange(groups)}", "gpu0") for s in range(n)}
    gscore = {g: rng.choice((0.5, 0.25, rng.random())) for g in set(group.values())}
    ids = {s: f"i{rng.randrange(10**6):06d}-{s}" for s in range(n)}
    tiers.bulk([(-gscore[group[s]], group[s], ids[s], s) for s in range(n // 2)])
    for s in range(n // 2, n):
        new = group[s] not in tiers.groups
        tiers.add(s, ids[s], group[s], -gscore[group[s]])
        assert new == (group[s] not in {group[x] for x in range(s)}) and tiers.groups[group[s]].key[0] == -gscore[group[s]]
    moved = rng.sample(sorted(gscore), len(gscore) // 5)
    for g in moved:
        gscore[g] = rng.random()
    tiers.move_many([(g, -gscore[g]) for g in moved])
    return tiers, group, gscore, ids


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(0, 400), k=st.integers(1, 40), groups=st.integers(1, 300),
       density=st.sampled_from((0.01, 0.2, 0.9)))
def test_best_k_equals_a_sort(seed: int, n: int, k: int, groups: int, density: float) -> None:
    """Best-k is the sort by (-score, group, id) of every candidate, cut at k."""
    from pyroaring import BitMap

    rng = random.Random(seed)
    tiers, group, gscore, ids = random_tiers(rng, n, groups)
    cand = BitMap(s for s in range(n) if rng.random() < density)
    want = sorted(cand, key=lambda s: (-gscore[group[s]], group[s], ids[s]))[:k]
    assert tiers.best(cand, len(cand), k) == want
    for t in tiers.tiers:
        assert t.keys == sorted(t.keys) and t.keys == [g.key for g in t.groups] and all(g.tier is t for g in t.groups)
        assert list(t.bm) == sorted(s for g in t.groups for s in g.slots)


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(0, 400), k=st.integers(1, 40), groups=st.integers(1, 30),
       density=st.sampled_from((0.01, 0.2, 0.9)))
def test_best_distinct_equals_the_first_of_each_group_in_a_sort(seed: int, n: int, k: int, groups: int, density: float) -> None:
    """The best slot of each of the k best groups: what sorting every candidate and keeping
    the first of each group gives."""
    from pyroaring import BitMap

    rng = random.Random(seed)
    tiers, group, gscore, ids = random_tiers(rng, n, groups)
    cand = BitMap(s for s in range(n) if rng.random() < density)
    want: list[int] = []
    taken: set[tuple] = set()
    for s in sorted(cand, key=lambda s: (-gscore[group[s]], group[s], ids[s])):
        if group[s] not in taken and len(want) < k:
            taken.add(group[s])
            want.append(s)
    assert tiers.best_distinct(cand, len(cand), k) == want


@SETTINGS
@given(seed=st.integers(0, 2**32))
def test_static_requirements_compile_to_the_reference(shapes_bundle: Bundle, seed: int) -> None:
    from policyc.compiler.semantics import require_holds, value_reads
    from policyc.matcher.instance_predicates import compile_static
    rng = random.Random(seed)
    static = [r.require for r in shapes_bundle.rules if not value_reads(r.require)]
    assert len(static) >= 3
    for n in range(10):
        inst = admissible(shapes_bundle, rng, f"i{n}")
        attrs = attributes(inst, shapes_bundle.contract(inst.model), shapes_bundle)
        for e in static:
            assert compile_static(e)(attrs) == require_holds(e, attrs, {})


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_bloom_slices_hold_only_counted_shards_and_never_rule_out_a_holder(seed: int) -> None:
    """After any adds and removes, each slice holds only shards that still count a key (what
    lets `ShardBloom.surviving` skip meeting a clause's shards with the shard set), and a
    shard holding an instance that meets every clause always survives (a small filter, so
    that false positives are common too)."""
    from policyc.matcher.bloom import ShardBloom

    rng = random.Random(seed)
    bloom = ShardBloom(m=16, k=2)
    keys = [("model", f"m{i}") for i in range(6)] + [("region", r) for r in ("eu", "us", "ap")] + [("tpm", True)]
    held: dict[int, list[list[tuple]]] = {}  # shard -> the key lists of its instances
    for _ in range(rng.randint(1, 80)):
        if held and rng.random() < 0.4:
            shard = rng.choice(sorted(held))
            inst = held[shard].pop(rng.randrange(len(held[shard])))
            bloom.remove(shard, inst)
            if not held[shard]:
                del held[shard]
        else:
            shard = rng.randrange(8)
            inst = rng.sample(keys, rng.randint(1, 3))
            bloom.add(shard, inst)
            held.setdefault(shard, []).append(inst)
        assert set(bloom.shards) == set(held)
        for sl in bloom.slices:
            assert set(sl) <= set(bloom.shards)
        clauses = tuple(frozenset(rng.sample(keys, rng.randint(1, 2))) for _ in range(rng.randint(1, 3)))
        got = set(bloom.surviving(clauses))
        assert got <= set(held)
        holders = {s for s, insts in held.items() if all(any(set(c) & set(i) for i in insts) for c in clauses)}
        assert holders <= got
