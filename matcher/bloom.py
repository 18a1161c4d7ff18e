"""Bit-sliced counting Bloom filters, one per shard of instance slots.

The fleet is cut into shards of `SHARD_SIZE` consecutive slots; slots are handed out so
that a shard holds instances of one rollout group (`FleetIndex.shard_group`, see `slots.py`), which is what
lets a filter say "this shard has no `model == fraud-scorer`" and skip it whole. Instead of
one bit array per shard, the filters are stored *sliced*: for each of the `m` bit positions,
a bitmap of the shards that have that bit set. Probing one key across every shard is then
`k` bitmap intersections, not one probe per shard.

Per-shard counters make it a counting Bloom filter: a key leaving a shard clears its bits
exactly when no other key in that shard still needs them, so removals never leave stale
bits behind. A Bloom filter never answers "absent" wrongly, so skipping by it never drops
a match; its false positives only cost the exact check some work.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Hashable, Iterable

from pyroaring import BitMap

SHARD_SIZE = 256
MEMO_SIZE = 4096
BloomKey = tuple[str, Hashable]  # (attribute, value)


class ShardBloom:
    def __init__(self, m: int = 512, k: int = 3) -> None:
        self.m = m
        self.k = k
        self.slices: list[BitMap] = [BitMap() for _ in range(m)]
        self.keys: dict[int, Counter[BloomKey]] = {}  # shard -> key -> instances
        self.bits: dict[int, Counter[int]] = {}  # shard -> bit position -> distinct keys
        self._positions: dict[BloomKey, tuple[int, ...]] = {}
        self.shards = BitMap()  # shards holding at least one instance
        self.version = 0  # bumped whenever a slice or the shard set changes (cache key)
        self._memo: OrderedDict[tuple[frozenset[BloomKey], ...], BitMap] = OrderedDict()  # `surviving`, at `_memo_version`
        self._memo_version = -1
        # one clause's shards (the union over its keys), at `_memo_version`: a new clause set
        # is mostly clauses seen before (family, region, flag), so it pays a few `&` only
        self._clause_memo: dict[frozenset[BloomKey], BitMap] = {}

    def positions(self, key: BloomKey) -> tuple[int, ...]:
        p = self._positions.get(key)
        if p is None:
            h = hash(key) & 0xFFFFFFFFFFFFFFFF
            h2 = (hash((key, 0x9E3779B97F4A7C15)) & 0xFFFFFFFF) | 1
            p = tuple(sorted({(h + i * h2) % self.m for i in range(self.k)}))
            self._positions[key] = p
        return p

    def add(self, shard: int, keys: Iterable[BloomKey], n: int = 1) -> None:
        """Count `n` instances carrying each of `keys` into the shard."""
        counts = self.keys.get(shard)
        if counts is None:
            counts = self.keys[shard] = Counter()
            self.bits[shard] = Counter()
            self.shards.add(shard)
            self.version += 1
        bits = self.bits[shard]
        for key in keys:
            c = counts.get(key, 0) + n
            counts[key] = c
            if c == n:  # the key is new to this shard
                for p in self.positions(key):
                    bits[p] += 1
                    if bits[p] == 1:
                        self.slices[p].add(shard)
                        self.version += 1

    def remove(self, shard: int, keys: Iterable[BloomKey]) -> None:
        counts, bits = self.keys[shard], self.bits[shard]
        for key in keys:
            c = counts[key] - 1
            if c:
                counts[key] = c
            else:  # the last instance with this key left the shard
                del counts[key]
                for p in self.positions(key):
                    bits[p] -= 1
                    if bits[p] == 0:
                        del bits[p]
                        self.slices[p].discard(shard)
                        self.version += 1
        if not counts:
            del self.keys[shard], self.bits[shard]
            self.shards.discard(shard)
            self.version += 1

    # ------------------------------------------------------------------ queries
    def maybe(self, key: BloomKey) -> BitMap:
        """Shards that may hold an instance with this key (a superset of those that do).
        Pairwise `&` (pyroaring's n-ary `BitMap.intersection` copies through Python and
        costs ten times as much for three slices)."""
        s = self.slices
        pos = self.positions(key)
        out = s[pos[0]]
        for p in pos[1:]:
            out = out & s[p]
        return out

    def surviving(self, clauses: list[frozenset[BloomKey]] | tuple[frozenset[BloomKey], ...]) -> BitMap:
        """Shards that may hold an instance satisfying every clause (each clause: at least
        one of its keys). Cached per clause set until the filters change (requests of
        different shapes often probe the same keys), in an LRU that lets its oldest entry
        go one at a time."""
        memo = self._memo
        if self._memo_version != self.version:
            memo.clear()  # answers about filters that are no longer these
            self._clause_memo.clear()
            self._memo_version = self.version
        memo_key = tuple(clauses)
        hit = memo.get(memo_key)
        if hit is None:
            if len(memo) >= MEMO_SIZE:
                memo.popitem(last=False)
            hit = memo[memo_key] = self._surviving(clauses)
        else:
            memo.move_to_end(memo_key)
        return hit

    def _surviving(self, clauses: list[frozenset[BloomKey]] | tuple[frozenset[BloomKey], ...]) -> BitMap:
        out: BitMap | None = None
        cm = self._clause_memo
        for clause in clauses:
            bm = cm.get(clause)
            if bm is None:
                if len(cm) >= MEMO_SIZE:
                    del cm[next(iter(cm))]  # the oldest goes
                bm = cm[clause] = self._clause(clause)
            out = bm if out is None else out & bm
            if not out:
                return out
        # every slice holds only shards with keys (`add` sets a bit for a shard it counts a key
        # into, `remove` clears it before the shard goes): a clause's shards need no `& shards`
        return self.shards if out is None else out

    def _clause(self, clause: frozenset[BloomKey]) -> BitMap:
        """Shards that may hold an instance with at least one of the clause's keys."""
        keys = list(clause)
        if not keys:
            return BitMap()
        bm = self.maybe(keys[0])
        for key in keys[1:]:
            bm = bm | self.maybe(key)
        return bm
