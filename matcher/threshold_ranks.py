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
members and hold a value on the right side of the cut. The first cut to name a tier meets
the tier's bitmap with the members once and keeps the result per tier (`inside`): a few
slots (typically one or two) as (slot, value position) pairs, filtered by position with the
least order key taken; many (a broad base) as a bitmap, the tier's groups walked in key
order until the first such slot (the first group usually has one). A base's cuts name few
tiers (the running minimum of a hundred ranks changes about five times), so a warm base
answers from that dict. (Members used to be listed by tier rank at the build, one argsort
and three `tolist` calls: that doubled the build of a base of a hundred members and made
one of a thousand cost ~0.1 ms, for about a microsecond per later request.)

Both arrays come from numpy in one pass over the base's members (their value positions,
`AttributeIndex.key_positions`, counted from one so that they bin as they are, and their
tier ranks, `ScoreTiers.rank_of`): a bincount with a cumulative sum, and a per-value minimum
with a running minimum, nine calls (~14 µs for a base of a hundred members, ~24 µs for a
thousand, on the shared 2-core machine at load 2). They go stale when the base's members
change (the index's membership version), when the attribute's distinct values change, or
when any slot changes tier (`ScoreTiers.rank_version`: a score push that moves groups
between tiers); a score change that keeps every group in its tier keeps them (and `inside`:
a tier's slots change only with a version). `FleetIndex.best_one` rebuilds them on a base's
second request since they went stale, and answers the first one from the base's bitmap: a
fleet that changes between every two requests never pays a build per request.

Bases built ahead of their requests (`FleetIndex.prebuild`: tens of thousands, most with a
few dozen members) keep the arrays compact (`_compact`): only the steps, at the value
positions the members hold, ~0.5 KB for twenty members instead of 7 KB.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

import numpy as np
from pyroaring import BitMap

from policyc.compiler.meaning import Cmp

from .attribute_index import AttributeIndex
from .ranking import ScoreTiers

BELOW = (Cmp.LT, Cmp.LE)  # the ordering keeps a prefix of the sorted values (else a suffix)
# numpy's functions bound once: a small base's build is a dozen calls of a microsecond each,
# and looking each up through the module costs a tenth of that again
_frombuffer, _bincount, _full = np.frombuffer, np.bincount, np.full
_add_accumulate, _minimum_accumulate, _minimum_at = np.add.accumulate, np.minimum.accumulate, np.minimum.at
_UINT32, _INTC, _INF = np.uint32, np.intc, np.inf
FEW = 48  # at most this many of the tier's slots are members: kept as (slot, position) pairs, filtered and ordered by key (a broad base walks the tier's groups)


class ThresholdRanks:
    """`counts` and best tier ranks per cut for one base's members and one ordered attribute,
    with the versions they were computed at, and the members met so far per best tier."""

    __slots__ = ("members", "counts", "best", "cuts", "ends", "total", "top", "inside", "index_version",
                 "keys_version", "rank_version")

    def __init__(self, members: BitMap, attr: AttributeIndex, below: bool, tiers: ScoreTiers,
                 index_version: int, compact: bool = False) -> None:
        self.members = members  # the base's members (may be the index's own bitmap: never mutated)
        self.index_version = index_version
        self.keys_version = attr.keys_version
        self.rank_version = tiers.rank_version
        # tier rank -> the base's members in that tier: (slot, value position) pairs for a few,
        # else their bitmap; filled by `best_at` as cuts name tiers (current while the versions are)
        self.inside: dict[float, list[tuple[int, int]] | BitMap] = {}
        n = len(attr.keys) + 1
        idx = _frombuffer(members.to_array(), dtype=_UINT32)
        pos = _frombuffer(attr.key_positions(), dtype=_INTC)  # a view: gone when this call ends
        if members and members.max() >= len(pos):  # members past every slot with a value
            idx = idx[idx < len(pos)]
        at = pos[idx]  # 0: no value (never meets an ordering), i + 1: the i-th value
        del pos
        counts = _bincount(at, minlength=n)
        counts[0] = 0
        self.counts: np.ndarray | None = _add_accumulate(counts, out=counts)  # [h]: members among the first h values (None: compact)
        per = _full(n, _INF)
        _minimum_at(per, at, tiers.rank_of[idx])
        per[0] = _INF
        if below:  # best[h]: among the first h values
            self.best: np.ndarray | array = _minimum_accumulate(per, out=per)
        else:  # best[h]: among the values from h on
            self.best = np.append(_minimum_accumulate(per[::-1])[::-1][1:], _INF)
        self.top = n  # one past the last value position
        self.total = int(counts[-1])
        self.cuts: array | None = None
        self.ends: array | None = None
        if compact:
            self._compact(below)

    def _compact(self, below: bool) -> None:
        """Keep the arrays only where they change (`compact`): both are steps that move only
        at the value positions the members hold, so `cuts` (those positions, ascending),
        `ends` (`counts` there) and `best` (the best rank from there: at the position for
        a prefix, just before it for a suffix) read exactly as the full arrays do, in
        memory that grows with the members rather than with the distinct values (a base of
        twenty members: ~0.5 KB, not 7 KB). Python arrays: indexed and bisected without
        numpy scalars."""
        counts, best = self.counts, self.best
        assert counts is not None and isinstance(best, np.ndarray)  # built full first
        ch = np.flatnonzero(counts[1:] != counts[:-1]) + 1
        self.cuts = array("i", ch.astype(_INTC).tobytes())
        self.ends = array("q", counts[ch].astype(np.int64).tobytes())
        self.best = array("d", (best[ch] if below else best[ch - 1]).tobytes())  # type: ignore[index]
        self.counts = None

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
    if counts is not None:
        if below:  # lo <= key position < hi (`key_positions` counts from one)
            count, lo, hi = int(counts[h]), 1, h + 1
        else:
            count, lo, hi = int(counts[-1] - counts[h]), h + 1, len(counts)
        if not count:
            return 0, None
        rank = float(ranks.best[h])
    else:  # compact: the step at or before h (`ThresholdRanks._compact`)
        i = bisect_right(ranks.cuts, h)  # type: ignore[arg-type]
        upto = ranks.ends[i - 1] if i else 0  # type: ignore[index]
        if below:
            count, lo, hi = upto, 1, h + 1
        else:
            count, lo, hi = ranks.total - upto, h + 1, ranks.top
        if not count:
            return 0, None
        rank = ranks.best[i - 1] if below else ranks.best[i]  # count > 0: the step exists
    inside = ranks.inside.get(rank)
    if inside is None:  # the first cut to name this tier: meet its bitmap with the members once
        tier = tiers.tier_at.get(rank)
        if tier is None:
            return count, None
        bm = tier.bm & ranks.members
        if len(bm) <= FEW:
            pos = attr.key_positions()  # current: `ranks` is, and was built after it
            inside = [(s, pos[s]) for s in bm.to_array()]
        else:
            inside = bm
        ranks.inside[rank] = inside
    if type(inside) is list:  # a few: filtered by value position, the least order key taken
        key = tiers.key_of
        best = None
        for s, p in inside:
            if lo <= p < hi and (best is None or key[s] < key[best]):
                best = s
        return count, best
    tier = tiers.tier_at.get(rank)
    if tier is None:
        return count, None
    pos = attr.key_positions()
    for g in tier.groups:  # key order, each group's slots in id order: the first hit is the best
        for s in g.slots:
            if s in inside and lo <= pos[s] < hi:
                return count, s
    return count, None
