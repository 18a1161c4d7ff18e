"""Best-k by score without materialising every match.

Instances are ordered by the key (-score, id): higher score first, ties by id. The key
space is cut into tiers of at most `2 * TARGET` instances; each tier is a bitmap plus the
list of its slots in key order. The tiers are kept in key order, so everything in an
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
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort

from pyroaring import BitMap

ScoreKey = tuple[float, str]  # (-score, instance id)
TARGET = 64
SMALL = 64  # at most this many candidates: pick from them directly


class ScoreTiers:
    __slots__ = ("bounds", "tiers", "orders", "keys", "home")

    def __init__(self) -> None:
        self.bounds: list[ScoreKey] = [(-float("inf"), "")]
        self.tiers: list[BitMap] = [BitMap()]
        self.orders: list[list[int]] = [[]]  # each tier's slots in key order
        self.keys: dict[int, ScoreKey] = {}
        # slot -> its tier's (bitmap, order): a removal finds its tier without a search
        self.home: dict[int, tuple[BitMap, list[int]]] = {}

    def _tier(self, key: ScoreKey) -> int:
        return bisect_right(self.bounds, key) - 1

    def add(self, slot: int, key: ScoreKey) -> None:
        keys = self.keys
        keys[slot] = key
        t = self._tier(key)
        tier, order = self.tiers[t], self.orders[t]
        tier.add(slot)
        insort(order, slot, key=keys.__getitem__)
        self.home[slot] = (tier, order)
        if len(order) > 2 * TARGET:
            self._split(t)

    def remove(self, slot: int) -> None:
        tier, order = self.home.pop(slot)
        tier.discard(slot)
        keys = self.keys
        del order[bisect_left(order, keys[slot], key=keys.__getitem__)]  # keys are unique
        del keys[slot]

    def _split(self, t: int) -> None:
        """Move the upper half of tier `t` into a new tier after it (the lower half stays
        in place, so only the moved slots change home)."""
        order = self.orders[t]
        high = order[len(order) // 2:]
        del order[len(order) // 2:]
        moved = BitMap(high)
        self.tiers[t].difference_update(moved)
        self.tiers.insert(t + 1, moved)
        self.orders.insert(t + 1, high)
        self.bounds.insert(t + 1, self.keys[high[0]])
        home = self.home
        for s in high:
            home[s] = (moved, high)

    def bulk(self, entries: list[tuple[float, str, int]]) -> None:
        """Replace the contents at once (index build) from (-score, id, slot) triples:
        flat triples sort about twice as fast as (slot, key) pairs under a key function."""
        entries = sorted(entries)
        self.keys = {slot: (neg, iid) for neg, iid, slot in entries}
        self.bounds = [(-float("inf"), "")]
        self.tiers = []
        self.orders = []
        slots = [e[2] for e in entries]
        for i in range(0, max(len(entries), 1), TARGET):
            chunk = slots[i:i + TARGET]
            if i > 0:
                self.bounds.append(entries[i][:2])
            self.tiers.append(BitMap(chunk))
            self.orders.append(chunk)
        self.home = {s: (tier, order) for tier, order in zip(self.tiers, self.orders) for s in order}

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
        for tier, order in zip(self.tiers, self.orders):
            n = tier.intersection_cardinality(cand)  # no bitmap built: a count only
            if not n:
                continue
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
