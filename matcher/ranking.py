"""Best-k by score without materialising every match.

Instances are ordered by the key (-score, id): higher score first, ties by id. The key
space is cut into tiers of at most `2 * TARGET` instances, each a bitmap; the tiers are
kept in key order. Best-k walks the tiers from the best, intersecting each with the
candidate bitmap, and stops once k candidates are collected: everything in an earlier tier
beats everything in a later one, so only the collected few need sorting. When 60,000 of
100,000 instances match, the first tier already holds about 40 of them.

A tier that grows past `2 * TARGET` (scores pushed by the placer move instances between
tiers) is split at its median key, so tiers stay small whatever the score distribution,
including many equal scores (the id breaks the tie).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

from pyroaring import BitMap

ScoreKey = tuple[float, str]  # (-score, instance id)
TARGET = 64
SMALL = 128  # at most this many candidates: sort them directly


class ScoreTiers:
    def __init__(self) -> None:
        self.bounds: list[ScoreKey] = [(-float("inf"), "")]
        self.tiers: list[BitMap] = [BitMap()]
        self.keys: dict[int, ScoreKey] = {}

    def _tier(self, key: ScoreKey) -> int:
        return bisect_right(self.bounds, key) - 1

    def add(self, slot: int, key: ScoreKey) -> None:
        self.keys[slot] = key
        t = self._tier(key)
        tier = self.tiers[t]
        tier.add(slot)
        if len(tier) > 2 * TARGET:
            self._split(t)

    def remove(self, slot: int) -> None:
        key = self.keys.pop(slot)
        self.tiers[self._tier(key)].discard(slot)

    def _split(self, t: int) -> None:
        members = sorted(self.tiers[t], key=self.keys.__getitem__)
        mid = len(members) // 2
        self.tiers[t] = BitMap(members[:mid])
        self.tiers.insert(t + 1, BitMap(members[mid:]))
        self.bounds.insert(t + 1, self.keys[members[mid]])

    def bulk(self, items: list[tuple[int, ScoreKey]]) -> None:
        """Replace the contents at once (index build)."""
        items = sorted(items, key=lambda it: it[1])
        self.keys = dict(items)
        self.bounds = [(-float("inf"), "")]
        self.tiers = []
        for i in range(0, max(len(items), 1), TARGET):
            chunk = items[i:i + TARGET]
            if i > 0:
                self.bounds.append(chunk[0][1])
            self.tiers.append(BitMap([s for s, _ in chunk]))

    def best(self, cand: BitMap, count: int, k: int) -> list[int]:
        """The k best slots of `cand` (which holds `count` slots), best first."""
        if k <= 0 or count == 0:
            return []
        key = self.keys.__getitem__
        if count <= SMALL:
            return heapq.nsmallest(k, cand, key=key)
        got: list[int] = []
        for tier in self.tiers:
            if tier:
                hit = tier & cand
                if hit:
                    got.extend(hit)
                    if len(got) >= k:
                        break
        if k == 1:
            return [min(got, key=key)]
        return heapq.nsmallest(k, got, key=key)
