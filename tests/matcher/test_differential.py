"""The index is an optimisation, never a change of meaning: for random fleets, registry
updates and requests, `Registry.match` equals `naive_match` (the compiled rules evaluated
instance by instance): same count, same set, same best-k, same applied rules; and
`Registry.admits` of every instance says whether it is in that set."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.compiler.bundle import Bundle
from policyc.matcher import Registry, Request, attributes, naive_match

from matcher_support import LABEL_VALUES, REGIONS, admissible

SLOS = (0.001, 0.05, 0.1, 0.12, 0.2, 0.5, 1.5, 2.0, 30.0)
BANDWIDTHS = (1e9, 8e10, 2e10, 4e11, 9e11, 1.2e12, 5e12)
FLOPS = (1e10, 8e10, 1.2e11, 1.5e12, 1e13)

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2**32)),
    st.tuples(st.just("remove"), st.integers(0, 10**6)),
    st.tuples(st.just("update"), st.integers(0, 10**6), st.integers(0, 2**32)),
    st.tuples(st.just("score"), st.integers(0, 10**6), st.sampled_from((0.0, 0.25, 0.5, 1.0)) | st.floats(0, 1)),
), max_size=25)


def opt(s: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | s


requests = st.fixed_dictionaries({
    "slo": opt(st.sampled_from(SLOS) | st.floats(0.001, 60)),
    "region": opt(st.sampled_from(REGIONS)),
    "model": opt(st.sampled_from(("fraud-scorer", "recommender", "clinical-notes", "support-chatbot", "nope"))),
    "min_bw": opt(st.sampled_from(BANDWIDTHS)),
    "max_flops": opt(st.sampled_from(FLOPS)),
    "team": opt(st.sampled_from(LABEL_VALUES["team"] + ("zzz",))),
    "secure": opt(st.booleans()),
    "tenant": opt(st.sampled_from(("acme-bank", "st-marys", "shopwave", "anonymous"))),
})


def typed(bundle: Bundle, raw: dict) -> Request:
    vars = {k: v for k, v in raw.items() if v is not None}
    if "tenant" in vars:
        vars["tenant_class"] = next(t.tenant_class for t in bundle.tenants if t.name == vars["tenant"])
    return Request.of(vars)


def apply(reg: Registry, bundle: Bundle, seed: int, fleet: int, script: list) -> None:
    rng = random.Random(seed)
    reg.add_many([admissible(bundle, rng, f"i{n:03d}") for n in range(fleet)],
                 {f"i{n:03d}": rng.choice((0.1, 0.5, 0.5, 0.9, rng.random())) for n in range(fleet)})
    counter = fleet
    for op in script:
        ids = sorted(e[0].id for e in reg.entries())
        if op[0] == "add":
            counter += 1
            reg.add(admissible(bundle, random.Random(op[1]), f"i{counter:03d}"), score=random.Random(op[1]).random())
        elif ids and op[0] == "remove":
            reg.remove(ids[op[1] % len(ids)])
        elif ids and op[0] == "update":
            reg.update(admissible(bundle, random.Random(op[2]), ids[op[1] % len(ids)]))
        elif ids and op[0] == "score":
            reg.set_score(ids[op[1] % len(ids)], op[2])


def check(reg: Registry, bundle: Bundle, req: Request) -> None:
    # attributes recomputed from the instances, not taken from the registry's cache
    entries = [(inst, attributes(inst, bundle.contract(inst.model), bundle), score) for inst, _, score in reg.entries()]
    for k in (1, 3, len(entries) + 1):
        got = reg.match(req, k)
        want = naive_match(bundle, entries, req.vars, k)
        assert got.count == len(want.ids)
        assert tuple(s.instance.id for s in got.best) == want.best
        assert tuple(r.id for r in got.rules) == want.rules
    assert {s.instance.id for s in reg.match(req, len(entries) + 1).best} == want.ids
    # one instance checked by id, on its own row (`row_check.py`): every instance, every shape of rule
    assert {inst.id for inst, _, _ in entries if reg.admits(req, inst.id)} == want.ids
    # distinct GPUs: the naive order, keeping the first instance of each (model, host, GPU)
    full = naive_match(bundle, entries, req.vars, len(entries) + 1).best
    by_id = {inst.id: inst for inst, _, _ in entries}
    firsts: list[str] = []
    taken: set[tuple[str, str, str]] = set()
    for iid in full:
        d = by_id[iid].deployment
        if (by_id[iid].model, d.host, d.gpu) not in taken:
            taken.add((by_id[iid].model, d.host, d.gpu))
            firsts.append(iid)
    for k in (1, 3, len(entries) + 1):
        got_d = reg.match(req, k, distinct_gpus=True)
        assert got_d.count == len(want.ids) and tuple(s.instance.id for s in got_d.best) == tuple(firsts[:k])
    ex = reg.explain(req)
    assert ex.count == got.count and ex.live == len(entries)
    assert sum(r.eliminated_in_order for r in ex.rules) == ex.live - ex.count


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), fleet=st.integers(0, 60), script=ops, reqs=st.lists(requests, min_size=1, max_size=6),
       shard=st.sampled_from((2, 4, 16, 256)))
def test_index_equals_naive_scan(shapes_bundle: Bundle, seed: int, fleet: int, script: list, reqs: list, shard: int) -> None:
    reg = Registry(shapes_bundle, shard_size=shard)
    apply(reg, shapes_bundle, seed, fleet, script)
    for raw in reqs:
        check(reg, shapes_bundle, typed(shapes_bundle, raw))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), reqs=st.lists(requests, min_size=1, max_size=4))
def test_index_equals_naive_scan_at_a_few_thousand(shapes_bundle: Bundle, seed: int, reqs: list) -> None:
    """Large enough for many shards, multi-tier best-k walks and the Bloom mask."""
    reg = Registry(shapes_bundle, shard_size=32)
    apply(reg, shapes_bundle, seed, 1500, [("score", n * 7919, (n % 10) / 10) for n in range(50)]
          + [("remove", n * 31) for n in range(40)] + [("add", seed + n) for n in range(40)])
    for raw in reqs:
        check(reg, shapes_bundle, typed(shapes_bundle, raw))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32), req=requests)
def test_real_policies_equal_naive_scan(policies_bundle: Bundle, seed: int, req: dict) -> None:
    reg = Registry(policies_bundle, shard_size=8)
    apply(reg, policies_bundle, seed, 80, [])
    raw = {k: v for k, v in req.items() if k in {h.var for h in policies_bundle.headers}}
    check(reg, policies_bundle, typed(policies_bundle, raw))
