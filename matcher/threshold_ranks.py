"""The best candidate of a base for any threshold, by two array look-ups.

A fleet with an SLO per deployment sends requests that are mostly new shapes: the same
fixed values (family, region, flags: a `Base`, `plan.py`) with a latency target nobody sent
before. The one rule that reads the target, `slo_latency <= request.slo`, keeps those base
members whose value lies among the first `h` of the attribute's sorted distinct values,
where `h` is one bisection away from the target. So, per base and per cut `h`, two numbers
answer the request without building its candidate set:

- `counts[h]`: how many members hold one of the first `h` values (how many match);
- `best_below[h]`: the lowest score-tier rank among them (`ranking.py`: a tier's rank grows
  along the tier order, so the lowest rank names the tier that holds the best candidate).
  `best_above[h]` is the same for the values from `h` on (`>` and `>=`).

The best candidate is then the first, in the order, of that one tier's slots that are
members and hold a value on the right side of the cut. A small base lists its members by
tier rank, so those are found by one bisection (typically one or two slots, filtered by
value position, the least order key taken); a larger one meets the tier's bitmap with its
members, then either filters the few left the same way or, when many are left (a broad
base), walks the tier's groups in key order until the first such slot (the first group
usually has one).

Both arrays come from numpy in one pass over the base's members (their value positions,
`AttributeIndex.key_positions`, and their tier ranks, `ScoreTiers.rank_of`): a bincount with
a cumulative sum, and a per-value minimum with a running minimum (~13 µs for a base of a
hundred members, ~0.1 ms for ten thousand). They go stale when the base's members change
(the index's membership version), when the attribute's distinct values change, or when any
slot changes tier (`ScoreTiers.rank_version`: a score push that moves groups between
tiers); a score change that keeps every group in its tier keeps them. `FleetIndex.best_one`
rebuilds them on a base's second request since they went stale, and answers the first one
from the base's bitmap: a fleet that changes between every two requests never pays a build
per request.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
from pyroaring import BitMap

from policyc.compiler.meaning import Cmp

from .attribute_index import AttributeIndex
from .ranking import ScoreTiers

BELOW = (Cmp.LT, Cmp.LE)  # the ordering keeps a prefix of the sorted values (else a suffix)
FEW = 48  # at most this many of the tier's slots are members: filtered and ordered by key directly (a regional base; a broad one walks)
LISTED = 4096  # a base this small also lists its members by tier rank: the best tier's few found by bisection


class ThresholdRanks:
    """`counts` and best tier ranks per cut for one base's members and one ordered attribute,
    with the versions they were computed at."""

    __slots__ = ("members", "counts", "best", "listed", "index_version", "keys_version", "rank_version")

    def __init__(self, members: BitMap, attr: AttributeIndex, below: bool, tiers: ScoreTiers,
                 index_version: int) -> None:
        self.members = members  # the base's members (may be the index's own bitmap: never mutated)
        self.index_version = index_version
        self.keys_version = attr.keys_version
        self.rank_version = tiers.rank_version
        n = len(attr.keys)
        idx = np.frombuffer(members.to_array(), dtype=np.uint32)
        pos = np.frombuffer(attr.key_positions(), dtype=np.intc)  # a view: gone when this call ends
        if len(idx) and int(idx[-1]) >= len(pos):  # a member past every slot with a value (members ascend)
            idx = idx[idx < len(pos)]
        at = pos[idx] + 1  # 0: no value (never meets an ordering), i + 1: the i-th value
        del pos
        counts = np.bincount(at, minlength=n + 1)
        counts[0] = 0
        self.counts: np.ndarray = np.cumsum(counts, out=counts)  # [h]: members among the first h values
        per = np.full(n + 1, np.inf)
        ranks = tiers.rank_of[idx]
        np.minimum.at(per, at, ranks)
        per[0] = np.inf
        # (ranks ascending, their slots, their value positions) for a small base: its members in
        # the best tier without meeting the tier's bitmap with the base's
        self.listed: tuple[list[float], list[int], list[int]] | None = None
        if len(idx) <= LISTED:
            order = np.argsort(ranks, kind="stable")
            self.listed = (ranks[order].tolist(), idx[order].tolist(), (at[order] - 1).tolist())
        if below:  # best[h]: among the first h values
            self.best: np.ndarray = np.minimum.accumulate(per, out=per)
        else:  # best[h]: among the values from h on
            self.best = np.append(np.minimum.accumulate(per[::-1])[::-1][1:], np.inf)

    def current(self, index_version: int, attr: AttributeIndex, tiers: ScoreTiers) -> bool:
        return (self.index_version == index_version and self.keys_version == attr.keys_version
                and self.rank_version == tiers.rank_version)


def best_at(ranks: ThresholdRanks, attr: AttributeIndex, cmp: Cmp, value: float,
            tiers: ScoreTiers) -> tuple[int, int | None]:
    """(how many members meet `attr cmp value`, the best of them): the cut found by one
    bisection, the count and the best tier read from the arrays, the best candidate found
    in that tier. The best is None when nothing matches, and also when the arrays disagree
    with the tiers (never expected): the caller then answers the slow way."""
    h, below = attr.cut(cmp, value)
    counts = ranks.counts
    if below:
        count, lo, hi = int(counts[h]), 0, h
    else:
        count, lo, hi = int(counts[-1] - counts[h]), h, len(counts) - 1
    if not count:
        return 0, None
    rank = float(ranks.best[h])
    listed = ranks.listed
    if listed is not None:  # a small base: its members of that rank, by bisection
        rs, slots, at = listed
        key = tiers.key_of
        i = bisect_left(rs, rank)
        best = None
        while i < len(rs) and rs[i] == rank:
            if lo <= at[i] < hi and (best is None or key[slots[i]] < key[best]):
                best = slots[i]
            i += 1
        return count, best
    tier = tiers.tier_at.get(rank)
    if tier is None:
        return count, None
    inside = tier.bm & ranks.members
    pos = attr.key_positions()  # current: `ranks` is, and was built after it
    if len(inside) <= FEW:
        hits = [s for s in inside.to_array() if lo <= pos[s] < hi]
        if not hits:
            return count, None
        return count, (hits[0] if len(hits) == 1 else min(hits, key=tiers.key_of.__getitem__))
    for g in tier.groups:  # key order, each group's slots in id order: the first hit is the best
        for s in g.slots:
            if s in inside and lo <= pos[s] < hi:
                return count, s
    return count, None
