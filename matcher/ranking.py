"""Best-k by score without materialising every match.

Instances are ordered by the key (-score, id): higher score first, ties by id. The key
space is cut into tiers of at most `2 * TARGET` instances; each tier is a bitmap plus the
lists of its slots and keys in key order (`Tier`). The tiers are kept in key order, so everything in an
earlier tier beats everything in a later one.

Best-k walks the tiers from the best, counting each tier's intersection with the
candidate bitmap (a cardinality only: building a result bitmap costs more than the count),
walks the key-ordered list of a tier that has hits with membership tests, and stops as
soon as k candidates are collected; nothing is sorted on the hot path. A request matching
80 % of the fleet finds its best in the first tier after one count and one or two
membership tests; one matching 10 % finds about six candidates per tier. Candidate sets of
at most `SMALL` slots are ranked directly.

A tier that grows past `2 * TARGET` (scores pushed by the placer move instances between
tiers) is split at its median key, so tiers stay small whatever the score distribution,
including many equal scores (the id breaks the tie).

A batch of score changes (`move_many`, the placer's pushes via `Registry.set_scores`)
takes every slot out first, then finds all the new tiers in one `numpy.searchsorted` over
the tiers' lowest scores (`lows`; ids are compared only where a score equals a tier's
lowest), inserts, and splits the tiers that grew past `2 * TARGET` last, so that the tier
indices found stay valid while inserting. At 100,000 instances a score change costs mostly
cache misses on the (-score, id) tuples and float objects a bisection probes: hence the
vectorised tier search, and within a tier the scores bisected in a flat array of doubles
(`Tier.negs`), ids compared only among equal scores.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from typing import Hashable, Iterator, Mapping

import numpy as np
from pyroaring import BitMap

ScoreKey = tuple[float, str]  # (-score, instance id)
TARGET = 64
SMALL = 64  # at most this many candidates: pick from them directly
VECTOR = 8  # batches of at least this many keys find their tiers with numpy (below, its call costs more)


class Tier:
    """One tier: its slots as a bitmap (for counting candidates) and as parallel lists in
    key order: the slots (for the best-k walk), their keys, and the keys' first halves
    (-score) as a flat array of doubles. An update bisects the doubles (one contiguous
    block instead of a tuple and a float object per probe, which at 100,000 instances are
    cache misses) and compares ids only among equal scores."""

    __slots__ = ("bm", "slots", "keys", "negs")

    def __init__(self, slots: list[int], keys: list[ScoreKey], negs: array | None = None) -> None:
        self.bm = BitMap(slots)
        self.slots = slots
        self.keys = keys
        self.negs = array("d", [k[0] for k in keys]) if negs is None else negs

    def put(self, slot: int, key: ScoreKey) -> None:
        """Insert `slot` at its key's place."""
        negs = self.negs
        neg = key[0]
        i = bisect_right(negs, neg)
        if i and negs[i - 1] == neg:  # equal scores: the ids decide, among those only
            i = bisect_right(self.keys, key, bisect_left(negs, neg, 0, i), i)
        self.keys.insert(i, key)
        self.slots.insert(i, slot)
        negs.insert(i, neg)
        self.bm.add(slot)

    def take(self, slot: int, key: ScoreKey) -> None:
        """Take out `slot`, whose key is `key`."""
        negs, keys = self.negs, self.keys
        neg = key[0]
        i = bisect_left(negs, neg)
        if keys[i] is not key and keys[i] != key:  # equal scores before it: the ids decide
            i = bisect_left(keys, key, i, bisect_right(negs, neg, i))
        del keys[i], self.slots[i], negs[i]
        self.bm.discard(slot)


class ScoreTiers:
    __slots__ = ("bounds", "lows", "tiers", "keys", "home")

    def __init__(self) -> None:
        self.bounds: list[ScoreKey] = [(-float("inf"), "")]  # each tier's lowest key
        self.lows = np.array([-np.inf])  # bounds' first halves (-score), for `_locate`
        self.tiers: list[Tier] = [Tier([], [])]
        self.keys: dict[int, ScoreKey] = {}
        self.home: dict[int, Tier] = {}  # slot -> its tier: a removal needs no search

    def add(self, slot: int, key: ScoreKey) -> None:
        self.keys[slot] = key
        t = bisect_right(self.bounds, key) - 1
        tier = self.tiers[t]
        tier.put(slot, key)
        self.home[slot] = tier
        if len(tier.slots) > 2 * TARGET:
            self._split(t)

    def remove(self, slot: int) -> None:
        self.home.pop(slot).take(slot, self.keys.pop(slot))

    def move_many(self, moves: list[tuple[int, ScoreKey]]) -> None:
        """Give each slot (registered, and distinct within `moves`) its new key: the same
        order as `remove` + `add` one slot at a time, for a batch of score changes."""
        keys, home = self.keys, self.home
        moved: list[tuple[int, ScoreKey]] = []
        for slot, key in moves:
            old = keys[slot]
            if old == key:
                continue  # an unchanged score costs nothing
            home[slot].take(slot, old)
            moved.append((slot, key))
        if not moved:
            return
        tiers = self.tiers
        grown: set[int] = set()
        limit = 2 * TARGET
        for (slot, key), t in zip(moved, self._locate([key for _, key in moved])):
            tier = tiers[t]
            tier.put(slot, key)
            keys[slot] = key
            home[slot] = tier
            if len(tier.slots) > limit:
                grown.add(t)
        for t in sorted(grown, reverse=True):  # from the last: a split shifts only later indices
            self._split(t)

    def _locate(self, keys: list[ScoreKey]) -> list[int]:
        """The tier each key belongs in (`bisect_right(bounds, key) - 1` for each): the
        scores are searched in `lows` at once, the ids only where a score ties a bound."""
        bounds = self.bounds
        if len(keys) < VECTOR:
            return [bisect_right(bounds, key) - 1 for key in keys]
        lows = self.lows
        negs = np.array([key[0] for key in keys])
        where = np.searchsorted(lows, negs, side="right") - 1  # >= 0: lows[0] is -inf
        out: list[int] = where.tolist()
        ties = np.flatnonzero(lows[where] == negs)
        if len(ties):
            firsts = np.searchsorted(lows, negs[ties], side="left").tolist()
            for n, lo in zip(ties.tolist(), firsts):
                out[n] = bisect_right(bounds, keys[n], lo, out[n] + 1) - 1
        return out

    def _split(self, t: int) -> None:
        """Move the upper half of tier `t` into a new tier after it (the lower half stays
        in place, so only the moved slots change home); halves still over `2 * TARGET`
        (a batch can grow a tier by more than one) are split again."""
        tier = self.tiers[t]
        mid = len(tier.slots) // 2
        moved = Tier(tier.slots[mid:], tier.keys[mid:], tier.negs[mid:])
        del tier.slots[mid:], tier.keys[mid:], tier.negs[mid:]
        tier.bm.difference_update(moved.bm)
        self.tiers.insert(t + 1, moved)
        self.bounds.insert(t + 1, moved.keys[0])
        self.lows = np.insert(self.lows, t + 1, moved.keys[0][0])
        home = self.home
        for s in moved.slots:
            home[s] = moved
        if len(moved.slots) > 2 * TARGET:
            self._split(t + 1)
        if len(tier.slots) > 2 * TARGET:
            self._split(t)

    def bulk(self, entries: list[tuple[float, str, int]]) -> None:
        """Replace the contents at once (index build) from (-score, id, slot) triples:
        flat triples sort about twice as fast as (slot, key) pairs under a key function."""
        entries = sorted(entries)
        keys = [(neg, iid) for neg, iid, _ in entries]
        slots = [e[2] for e in entries]
        self.keys = dict(zip(slots, keys))
        negs = array("d", [e[0] for e in entries])
        self.tiers = [Tier(slots[i:i + TARGET], keys[i:i + TARGET], negs[i:i + TARGET])
                      for i in range(0, max(len(entries), 1), TARGET)]
        self.bounds = [(-float("inf"), "")] + [tier.keys[0] for tier in self.tiers[1:]]
        self.lows = np.array([b[0] for b in self.bounds])
        self.home = {s: tier for tier in self.tiers for s in tier.slots}

    def best(self, cand: BitMap, count: int, k: int) -> list[int]:
        """The k best slots of `cand` (which holds `count` slots), best first."""
        if k <= 0 or count == 0:
            return []
        if count <= SMALL:
            if k == 1:
                return [min(cand, key=self.keys.__getitem__)]
            return heapq.nsmallest(k, cand, key=self.keys.__getitem__)
        got: list[int] = []
        need = k
        for tier in self.tiers:
            n = tier.bm.intersection_cardinality(cand)  # no bitmap built: a count only
            if not n:
                continue
            order = tier.slots
            if n <= need:
                got.extend(order if n == len(order) else [s for s in order if s in cand])
                need -= n
                if not need:
                    return got
            else:
                for s in order:
                    if s in cand:
                        got.append(s)
                        need -= 1
                        if not need:
                            return got
        return got

    def best_distinct(self, cand: BitMap, count: int, k: int, group: Mapping[int, Hashable]) -> list[int]:
        """The best slot of each of the k best groups among `cand`, best first: the slots of
        one group (instances of one model on one GPU, which share the GPU's score) would
        otherwise fill the k places with copies of one choice."""
        if k <= 0 or count == 0:
            return []
        ordered = sorted(cand, key=self.keys.__getitem__) if count <= SMALL else self._in_order(cand, count)
        seen: set[Hashable] = set()
        got: list[int] = []
        for s in ordered:
            g = group[s]
            if g not in seen:
                seen.add(g)
                got.append(s)
                if len(got) == k:
                    break
        return got

    def _in_order(self, cand: BitMap, count: int) -> Iterator[int]:
        """`cand`'s slots in key order, walking the tiers as `best` does: a tier without a
        candidate costs one count, and the walk ends with the last candidate."""
        left = count
        for tier in self.tiers:
            n = tier.bm.intersection_cardinality(cand)
            if not n:
                continue
            for s in tier.slots:
                if s in cand:
                    yield s
            left -= n
            if not left:
                return
