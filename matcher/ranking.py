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
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right

from pyroaring import BitMap

ScoreKey = tuple[float, str]  # (-score, instance id)
TARGET = 64
SMALL = 64  # at most this many candidates: pick from them directly


class Tier:
    """One tier: its slots as a bitmap (for counting candidates) and as two parallel lists
    in key order, the slots (for the best-k walk) and their keys (so that an update
    bisects a short list of keys instead of looking each probe's key up in the fleet-wide
    `keys` dict, which costs a cache miss per probe)."""

    __slots__ = ("bm", "slots", "keys")

    def __init__(self, slots: list[int], keys: list[ScoreKey]) -> None:
        self.bm = BitMap(slots)
        self.slots = slots
        self.keys = keys


class ScoreTiers:
    __slots__ = ("bounds", "tiers", "keys", "home")

    def __init__(self) -> None:
        self.bounds: list[ScoreKey] = [(-float("inf"), "")]  # each tier's lowest key
        self.tiers: list[Tier] = [Tier([], [])]
        self.keys: dict[int, ScoreKey] = {}
        self.home: dict[int, Tier] = {}  # slot -> its tier: a removal needs no search

    def add(self, slot: int, key: ScoreKey) -> None:
        self.keys[slot] = key
        t = bisect_right(self.bounds, key) - 1
        tier = self.tiers[t]
        i = bisect_right(tier.keys, key)
        tier.keys.insert(i, key)
        tier.slots.insert(i, slot)
        tier.bm.add(slot)
        self.home[slot] = tier
        if len(tier.slots) > 2 * TARGET:
            self._split(t)

    def remove(self, slot: int) -> None:
        tier = self.home.pop(slot)
        i = bisect_left(tier.keys, self.keys.pop(slot))  # keys are unique: this is the slot's
        del tier.keys[i], tier.slots[i]
        tier.bm.discard(slot)

    def _split(self, t: int) -> None:
        """Move the upper half of tier `t` into a new tier after it (the lower half stays
        in place, so only the moved slots change home)."""
        tier = self.tiers[t]
        mid = len(tier.slots) // 2
        moved = Tier(tier.slots[mid:], tier.keys[mid:])
        del tier.slots[mid:], tier.keys[mid:]
        tier.bm.difference_update(moved.bm)
        self.tiers.insert(t + 1, moved)
        self.bounds.insert(t + 1, moved.keys[0])
        home = self.home
        for s in moved.slots:
            home[s] = moved

    def bulk(self, entries: list[tuple[float, str, int]]) -> None:
        """Replace the contents at once (index build) from (-score, id, slot) triples:
        flat triples sort about twice as fast as (slot, key) pairs under a key function."""
        entries = sorted(entries)
        keys = [(neg, iid) for neg, iid, _ in entries]
        slots = [e[2] for e in entries]
        self.keys = dict(zip(slots, keys))
        self.tiers = [Tier(slots[i:i + TARGET], keys[i:i + TARGET]) for i in range(0, max(len(entries), 1), TARGET)]
        self.bounds = [(-float("inf"), "")] + [tier.keys[0] for tier in self.tiers[1:]]
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
