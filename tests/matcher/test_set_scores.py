"""Batched score updates (`Registry.set_scores`) mean what the same updates applied one by
one with `set_score` mean: same best-k order, same scores, same errors; a refused batch
changes nothing."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from policyc.compiler.bundle import Bundle
from policyc.matcher import Registry, RegistryError, Request, UnknownInstanceError, attributes, naive_match
from policyc.matcher.ranking import TARGET, VECTOR, ScoreTiers

from matcher_support import admissible
from test_differential import requests, typed

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# few distinct values, so that batches tie on scores (ids decide) and pile into one tier
scores = st.sampled_from((0.0, 0.25, 0.5, 1.0)) | st.floats(0, 1)
batches = st.lists(st.lists(st.tuples(st.integers(0, 10**6), scores), max_size=3 * VECTOR), max_size=6)


def fleet(bundle: Bundle, seed: int, n: int) -> Registry:
    rng = random.Random(seed)
    insts = [admissible(bundle, rng, f"i{k:03d}") for k in range(n)]
    return Registry(bundle, insts, {i.id: rng.choice((0.5, 0.5, rng.random())) for i in insts}, shard_size=16)


def ranking(reg: Registry, reqs: list[Request]) -> list[tuple]:
    """Everything a reader sees of the scores: best-k ids and scores per request, every score."""
    n = len(reg) + 1
    seen = [tuple((s.instance.id, s.score) for s in reg.match(q, k).best) for q in reqs for k in (1, 5, n)]
    return seen + [sorted((inst.id, score) for inst, _, score in reg.entries())]


def tiers_consistent(tiers: ScoreTiers) -> None:
    """The structure's invariants: tiers in key order, each sorted, its views agreeing;
    every group's members in id order, in its tier's bitmap, and found by slot."""
    assert tiers.bounds == sorted(tiers.bounds) and list(tiers.lows) == [b[0] for b in tiers.bounds]
    assert len(tiers.bounds) == len(tiers.tiers)
    for t, tier in enumerate(tiers.tiers):
        assert len(tier.groups) <= 2 * TARGET
        assert tier.keys == sorted(tier.keys) and tier.keys == [g.key for g in tier.groups]
        assert list(tier.negs) == [k[0] for k in tier.keys]
        assert list(tier.bm) == sorted(s for g in tier.groups for s in g.slots)
        for g in tier.groups:
            assert g.tier is tier and tiers.groups[g.name] is g and g.key[1] == g.name and g.slots
            assert g.ids == sorted(g.ids) and (g.bm is None if len(g.slots) == 1 else list(g.bm) == sorted(g.slots))
            assert all(tiers.group_of[s] is g and tiers.key_of[s][2] == i for s, i in zip(g.slots, g.ids))
        assert all(tiers.bounds[t] <= k for k in tier.keys)
        if t + 1 < len(tiers.tiers):
            assert all(k < tiers.bounds[t + 1] for k in tier.keys)
    assert sum(len(t.groups) for t in tiers.tiers) == len(tiers.groups)
    assert sum(len(g.slots) for g in tiers.groups.values()) == len(tiers.group_of) == len(tiers.key_of)


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(1, 200), script=batches, reqs=st.lists(requests, min_size=1, max_size=3))
def test_batches_equal_one_by_one(shapes_bundle: Bundle, seed: int, n: int, script: list, reqs: list) -> None:
    batched, single = fleet(shapes_bundle, seed, n), fleet(shapes_bundle, seed, n)
    typed_reqs = [typed(shapes_bundle, raw) for raw in reqs] + [Request.of({})]
    ids = sorted(e[0].id for e in batched.entries())
    for raw in script:
        updates = [(ids[i % len(ids)], s) for i, s in raw]
        batched.set_scores(updates)
        for iid, s in updates:  # the naive oracle
            single.set_score(iid, s)
        assert ranking(batched, typed_reqs) == ranking(single, typed_reqs)
        tiers_consistent(batched._tiers)
    entries = [(inst, attributes(inst, shapes_bundle.contract(inst.model), shapes_bundle), score)
               for inst, _, score in batched.entries()]
    for q in typed_reqs:  # and both equal the reference scan
        want = naive_match(shapes_bundle, entries, q.vars, 7)
        assert tuple(s.instance.id for s in batched.match(q, 7).best) == want.best


@SETTINGS
@given(seed=st.integers(0, 2**32), n=st.integers(0, 700), groups=st.integers(1, 400),
       script=st.lists(st.lists(st.tuples(st.integers(0, 10**6), scores), max_size=300), max_size=5))
def test_tier_moves_equal_remove_then_add(seed: int, n: int, groups: int, script: list) -> None:
    """A batch of group moves equals taking every member out and adding it back with the
    new score. Large batches into few distinct scores grow one tier by more than
    `2 * TARGET` groups: it is split until every tier is small again."""
    rng = random.Random(seed)
    ids = {s: f"i{rng.randrange(10**6):06d}-{s}" for s in range(n)}
    group = {s: ("m", f"h{rng.randrange(groups):03d}", "gpu0") for s in range(n)}
    gscore = {g: rng.choice((0.5, rng.random())) for g in group.values()}
    many, one = ScoreTiers(), ScoreTiers()
    start = [(-gscore[group[s]], group[s], ids[s], s) for s in range(n)]
    many.bulk(start)
    one.bulk(start)
    names = sorted(gscore)
    for raw in script:
        moves = {names[i % len(names)]: -s for i, s in raw} if n else {}
        moved = many.move_many(list(moves.items()))
        assert {g.name for g in moved} == {g for g, neg in moves.items() if neg != -gscore[g]}
        for g, neg in moves.items():
            gscore[g] = -neg
            for s in [s for s in range(n) if group[s] == g]:
                one.remove(s)
            for s in [s for s in range(n) if group[s] == g]:
                one.add(s, ids[s], g, neg)
        tiers_consistent(many)
        tiers_consistent(one)
        cand = BitMap(s for s in range(n) if rng.random() < 0.3)
        for c in (cand, BitMap(range(n))):
            want = sorted(c, key=lambda s: (-gscore[group[s]], group[s], ids[s]))
            assert many.best(c, len(c), 100) == one.best(c, len(c), 100) == want[:100]


BAD = [  # (update, error type, words the message must hold)
    (("nope", 0.5), UnknownInstanceError, ("`nope`", "no instance")),
    (("i001", 1.5), RegistryError, ("`i001`", "[0, 1]", "`1.5`")),
    (("i001", -0.25), RegistryError, ("`i001`", "[0, 1]", "`-0.25`")),
    (("i001", math.nan), RegistryError, ("`i001`", "[0, 1]", "`nan`")),
    (("i001", math.inf), RegistryError, ("`i001`", "[0, 1]", "`inf`")),
    (("i001", True), RegistryError, ("`i001`", "[0, 1]", "`True`")),
    (("i001", "0.5"), RegistryError, ("`i001`", "[0, 1]", "`'0.5'`")),
    (("nope", math.nan), RegistryError, ("`nope`", "[0, 1]", "`nan`")),  # the score is checked first, as set_score does
]


@pytest.mark.parametrize("bad,error,words", BAD, ids=[f"{b[0]}={b[1]!r}" for b, _, _ in BAD])
def test_a_bad_item_refuses_the_whole_batch(policies_bundle: Bundle, bad: tuple, error: type, words: tuple) -> None:
    reg = fleet(policies_bundle, 3, 40)
    reqs = [Request.of({})]
    before = ranking(reg, reqs)
    good = [(f"i{k:03d}", 1.0 - k / 100) for k in range(2, 30)]  # enough to take the vectorised path
    with pytest.raises(error) as batch_err:
        reg.set_scores(good[:5] + [bad] + good[5:] + [("nope", 0.5)])
    assert type(batch_err.value) is error and all(w in str(batch_err.value) for w in words), str(batch_err.value)
    assert ranking(reg, reqs) == before  # nothing changed, not even the items before the bad one
    with pytest.raises(error) as one_err:
        reg.set_score(*bad)
    assert str(one_err.value) == str(batch_err.value)
    reg.set_scores(good)  # the registry still takes a good batch
    assert reg.score("i002") == 0.98


def test_scores_are_taken_as_set_score_takes_them(policies_bundle: Bundle) -> None:
    """Ints and numpy floats in range are accepted as floats; a repeated id keeps its last
    score; an empty batch is nothing."""
    reg = fleet(policies_bundle, 5, 20)
    reg.set_scores([("i001", 1), ("i002", np.float64(0.75)), ("i003", 0.1), ("i003", 0.9)])
    assert [(reg.score(i), type(reg.score(i))) for i in ("i001", "i002", "i003")] == \
        [(1.0, float), (0.75, float), (0.9, float)]
    before = ranking(reg, [Request.of({})])
    reg.set_scores([])
    reg.set_scores(iter([("i004", reg.score("i004"))]))  # unchanged: moves nothing
    assert ranking(reg, [Request.of({})]) == before
    tiers_consistent(reg._tiers)


def test_one_batch_onto_one_score_splits_until_every_tier_is_small() -> None:
    """700 groups moved to one score land in one tier (their names order them): it is
    split again and again, not just halved once."""
    n = 700
    tiers = ScoreTiers()
    tiers.bulk([(-k / n, f"g{k:03d}", f"i{k:03d}", k) for k in range(n)])
    tiers.move_many([(f"g{s:03d}", -0.5) for s in range(n)])
    tiers_consistent(tiers)
    assert tiers.best(BitMap(range(n)), n, 3) == [0, 1, 2]


def test_members_leave_and_join_groups() -> None:
    """A group goes when its last member leaves and comes back with the score it is given;
    a member joining an existing group with another score moves the whole group."""
    tiers = ScoreTiers()
    tiers.add(1, "a", "g1", -0.5)
    tiers.add(2, "b", "g2", -0.4)
    assert set(tiers.groups) == {"g1", "g2"}
    tiers.add(3, "c", "g1", -0.5)
    assert set(tiers.groups) == {"g1", "g2"} and tiers.groups["g1"].ids == ["a", "c"]
    everything = BitMap([1, 2, 3])
    assert tiers.best(everything, 3, 3) == [1, 3, 2] and tiers.best_distinct(everything, 3, 3) == [1, 2]
    tiers.add(4, "0", "g2", -0.9)  # joins g2 with 0.9: g2 (both members) now first
    assert set(tiers.groups) == {"g1", "g2"}
    everything.add(4)
    assert tiers.best(everything, 4, 4) == [4, 2, 1, 3] and tiers.score_of("g2") == 0.9
    tiers.remove(4)
    tiers.remove(1)
    assert set(tiers.groups) == {"g1", "g2"}  # each still has a member
    tiers.remove(3)
    assert set(tiers.groups) == {"g2"} and tiers.score_of("g1") is None
    tiers_consistent(tiers)
    assert tiers.best(BitMap([2]), 1, 4) == [2] and tiers.score_of("g2") == 0.9
