"""The groups kept per candidate bitmap (`CandidateGroups`): best-k over a bitmap reads the
groups' scores as they are now, and a membership change (an instance added to or removed
from a group, the bitmap changed in place) is never answered from the groups kept before
it. Checked against ordering every candidate by its key, with tied scores, through batches
of score moves, adds and removes."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from policyc.matcher.ranking import ScoreTiers


def _reference(tiers: ScoreTiers, cand: BitMap, k: int, distinct: bool) -> list[int]:
    order = sorted(cand, key=tiers.key_of.__getitem__)
    if not distinct:
        return order[:k]
    got: list[int] = []
    seen: set = set()
    for s in order:
        name = tiers.group_of[s].name
        if name not in seen:
            seen.add(name)
            got.append(s)
    return got[:k]


ops = st.lists(st.tuples(st.sampled_from(("move", "move", "move", "add", "remove")), st.integers(0, 10**6)), max_size=40)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), script=ops, n_groups=st.integers(5, 160))
def test_best_k_over_kept_groups_equals_ordering_every_candidate(seed: int, script: list, n_groups: int) -> None:
    rng = random.Random(seed)
    levels = (-0.9, -0.5, -0.5, -0.1)  # few scores: groups tie and names decide
    groups = [f"g{n:03d}" for n in range(n_groups)]
    neg = {g: rng.choice(levels) for g in groups}
    entries, slot = [], 0
    for g in groups:
        for _ in range(rng.randint(1, 4)):
            entries.append((neg[g], g, f"i{slot:04d}", slot))
            slot += 1
    tiers = ScoreTiers()
    tiers.bulk(entries)
    live = {s for _, _, _, s in entries}
    cand = BitMap(s for s in live if rng.random() < 0.6)  # a request's candidates: the path read directly below
    for op, x in [("move", 0)] + script:
        if op == "move":  # a batch of moves, as a score push makes them
            names = {groups[(x + 7 * i) % len(groups)] for i in range(1 + x % 30)}
            tiers.move_many([(g, rng.choice(levels + (rng.uniform(-1, 0),))) for g in sorted(names) if g in tiers.groups])
        elif op == "add":
            g = groups[x % len(groups)]
            tiers.add(slot, f"i{slot:04d}", g, tiers.groups[g].key[0] if g in tiers.groups else rng.choice(levels))
            live.add(slot)
            if x % 2:
                cand.add(slot)  # the kept bitmap changes in place, as the index's own bitmaps do
            slot += 1
        elif live:
            s = sorted(live)[x % len(live)]
            tiers.remove(s)
            live.discard(s)
            cand.discard(s)
        for k in (2, 5, 12):
            for distinct in (False, True):
                assert tiers._gathered(cand, k, distinct) == _reference(tiers, cand, k, distinct), (op, k, distinct)


def test_the_best_groups_falling_behind_many_others_at_once() -> None:
    """The best groups of a bitmap fall, many at once, behind groups that ranked after them,
    and then two jump to the front: each answer is the order of the scores as they are."""
    tiers = ScoreTiers()
    tiers.bulk([(-1.0 + n / 1000, f"g{n:03d}", f"i{n:03d}", n) for n in range(200)])  # g000 best, ... g199 worst
    cand = BitMap(range(200))
    assert tiers._gathered(cand, 10, True) == list(range(10))
    tiers.move_many([(f"g{n:03d}", -0.1) for n in range(20)])  # 20 of them fall behind g026..g199
    assert tiers._gathered(cand, 10, True) == _reference(tiers, cand, 10, True) == [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    tiers.move_many([(f"g{n:03d}", -2.0) for n in (150, 3)])  # one left out and one kept jump to the front
    assert tiers._gathered(cand, 10, True) == _reference(tiers, cand, 10, True)[:10] == [3, 150, 20, 21, 22, 23, 24, 25, 26, 27]
