"""The columnar build's shortcuts mean what the plain structures mean: the score order found
by a numpy lexsort on the group names' parts (`registry._score_order`) and filled by
`ScoreTiers.bulk_sorted` is `ScoreTiers.bulk`'s (a Python sort of the entries), and the id ->
row map a check by id reads (`Registry.admits`) is the index's row of that id's slot through
adds, removals, updates and a bundle swap."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policyc.matcher import Registry
from policyc.matcher.ranking import ScoreTiers
from policyc.matcher.registry import _score_order

from fleet_shapes import KINDS, make_fleet, make_fleet_batch, request_headers

# few distinct parts and scores: groups of several members, ties on scores and on parts
# ("a" < "a0" < "b": a prefix sorts first, as Python orders strings)
parts = st.sampled_from(("a", "a0", "b", "", "Z", "é"))
entries = st.lists(st.tuples(parts, parts, parts, st.sampled_from((0.0, 0.5, 1.0, 0.25))), max_size=120)


def _view(t: ScoreTiers) -> tuple:
    """Everything the order is made of, comparable across two builds."""
    return ([(g.key, g.ids, g.slots, g.num, g.bm is None) for g in t.numbered if g is not None],
            [([g.name for g in tier.groups], tier.rank, list(tier.bm)) for tier in t.tiers],
            t.key_of, {s: g.name for s, g in t.group_of.items()}, t.bounds, list(t.lows),
            t.rank_of.tolist(), t.neg_of.tolist(), t.num_of.tolist(), t.neg_by_num.tolist())


@settings(max_examples=60, deadline=None)
@given(rows=entries, seed=st.integers(0, 2**32))
def test_lexsort_build_is_the_sorted_build(rows: list, seed: int) -> None:
    rng = random.Random(seed)
    n = len(rows)
    ids = [f"i{rng.randrange(10**4):04d}-{k}" for k in range(n)]
    slots = list(range(n))
    rng.shuffle(slots)
    names = [(m, h, g) for m, h, g, _ in rows]
    gscore = {nm: sc for nm, (_, _, _, sc) in zip(names, rows)}  # a group's score: its last member's
    negs = -np.array([gscore[nm] for nm in names], dtype=np.float64)
    plain, fast = ScoreTiers(), ScoreTiers()
    plain.bulk([(-gscore[nm], nm, i, s) for nm, i, s in zip(names, ids, slots)])
    order = _score_order(negs, tuple(list(c) for c in zip(*names)) if n else ([], [], []), ids)
    pick = order.tolist()
    fast.bulk_sorted(negs[order], [names[i] for i in pick], [ids[i] for i in pick], [slots[i] for i in pick])
    assert _view(fast) == _view(plain)


def test_bulk_refuses_a_group_with_two_scores() -> None:
    with pytest.raises(ValueError, match=r"group 'g': members with different scores"):
        ScoreTiers().bulk([(-0.5, "g", "a", 0), (-0.7, "g", "b", 1), (-0.6, "h", "c", 2)])
    with pytest.raises(ValueError, match="different scores"):
        ScoreTiers().bulk_sorted(np.array([-0.5, -0.7]), ["g", "g"], ["a", "b"], [0, 1])


def _rows_agree(reg: Registry) -> None:
    rows = reg.index.rows.rows
    assert reg._row_of == {iid: rows[slot] for iid, slot in reg._slot_of.items()}


def test_row_of_follows_adds_removes_updates_and_a_swap() -> None:
    big, small = make_fleet_batch(400, 3), make_fleet(200, 3)
    reg = Registry(big.bundle, shard_size=8, prebuild=False)
    reg.add_batch(big.batch)
    _rows_agree(reg)
    rng = random.Random(2)
    gone = rng.sample(big.batch.ids, 40)
    for iid in gone[:20]:
        reg.remove(iid)
    for iid in big.batch.ids[:30]:
        if iid in reg:
            reg.update(reg.get(iid).model_copy(update={"labels": {"tier": "gold"}}))
    extra = make_fleet(30, 9, families=1)
    for inst in extra.instances:
        if inst.model in {c.name for c in big.bundle.contracts} and inst.id not in reg:
            reg.add(inst)
    _rows_agree(reg)
    evicted = reg.swap_bundle(small.bundle, evict_inadmissible=True)
    assert evicted and not set(evicted) & set(reg._row_of)
    _rows_agree(reg)
    for kind in KINDS:  # every live id answers as the plan's candidates say
        q = reg.parse_request(request_headers(kind, rng))
        want = reg.matches(q, form="id_set").id_set
        assert {iid for iid in reg._row_of if reg.admits(q, iid)} == want
