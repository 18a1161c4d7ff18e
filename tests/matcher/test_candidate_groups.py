"""The groups kept per candidate bitmap (`CandidateGroups`): best-k over a bitmap reads the
groups' scores as they are now, and a membership change (an instance added to or removed
from a group, the bitmap changed in place) is never answered from the groups kept before
it. Checked against ordering every candidate by its key, on sparse bitmaps (the gathered
path) with tied scores, through score moves, adds and removes."""

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


ops = st.lists(st.tuples(st.sampled_from(("move", "add", "remove")), st.integers(0, 10**6)), max_size=25)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), script=ops)
def test_best_k_over_kept_groups_equals_ordering_every_candidate(seed: int, script: list) -> None:
    rng = random.Random(seed)
    levels = (-0.9, -0.5, -0.5, -0.1)  # few scores: groups tie and names decide
    groups = [f"g{n:02d}" for n in range(40)]
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
        if op == "move":
            g = groups[x % len(groups)]
            if g in tiers.groups:
                tiers.move_many([(g, rng.choice(levels))])
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
