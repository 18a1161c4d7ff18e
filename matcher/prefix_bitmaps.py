"""Range predicates in two bitmap operations, whatever the number of distinct values.

An ordered attribute (`slo_latency`, `bandwidth`) keeps its distinct values sorted and a
postings bitmap per value. `slo_latency <= request.slo` is then "the union of the postings
of the first h values" (h found by bisection); unioning up to hundreds of postings per
request (a fleet where every deployment has its own SLO has 451 of them) made that one rule
cost a millisecond.

Here the sorted values are cut into blocks of `B` (about the square root of their number),
and two kinds of prefix unions are kept:

- `outer[j]`: every instance whose value is among the first `j * B` values;
- `inner[j][r]`: every instance whose value is among values `j * B .. j * B + r - 1`.

The first h values are `outer[h // B] | inner[h // B][h % B]`: one union of two bitmaps (or
none, when one is empty). An instance added or removed with a value that already has a
posting touches at most `B + len(values) / B` of these bitmaps (about 2 * sqrt(n) cheap
in-place adds). A value new to the attribute, or one whose last instance left, shifts the
blocks: the structure is marked stale and rebuilt at the next query (O(values), which a
real fleet pays when a new SLO is rolled out, not per request).

`lower(h)` results are also remembered until the attribute next changes (`version`): a
steady fleet answers a range it has seen with one dict look-up.
"""

from __future__ import annotations

from math import isqrt

from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

EMPTY = BitMap()
DIRECT = 8  # at most this many values: union their postings directly, keep no prefixes
MEMO = 512  # lower(h) answers kept per attribute (an LRU; dropped as a whole when the attribute changes)


class PrefixBitmaps:
    """Prefix unions over one ordered attribute's postings. The caller (`AttributeIndex`)
    owns `keys` and `postings` and tells this structure about every change."""

    __slots__ = ("block", "outer", "inner", "stale", "memo", "version", "memo_version")

    def __init__(self) -> None:
        self.block = 0
        self.outer: list[BitMap] = []
        self.inner: list[list[BitMap]] = []
        self.stale = True
        self.memo: dict[int, BitMap] = {}
        self.version = 0  # bumped by every change to the attribute's postings
        self.memo_version = -1

    def rebuild(self, keys: list[float], postings: dict[Scalar, BitMap]) -> None:
        n = len(keys)
        self.stale = False
        if n <= DIRECT:
            self.block, self.outer, self.inner = 0, [], []
            return
        b = self.block = isqrt(n - 1) + 1
        outer: list[BitMap] = []
        inner: list[list[BitMap]] = []
        acc = BitMap()
        for j in range(0, n, b):
            outer.append(acc.copy())
            run = BitMap()
            rows = [EMPTY]
            for k in keys[j:j + b - 1]:  # rows[r]: the block's first r values
                run |= postings[k]
                rows.append(run.copy())
            inner.append(rows)
            for k in keys[j:j + b]:
                acc |= postings[k]
        outer.append(acc)  # outer[len(outer) - 1]: every value (h == n)
        self.outer, self.inner = outer, inner

    def changed(self, i: int, slot: int, added: bool) -> None:
        """Instance `slot` gained (or lost) the value at sorted position `i`, a value that
        keeps its posting: add it to (take it from) every prefix that covers position i."""
        self.version += 1
        if self.stale or not self.block:
            return
        j, r = divmod(i, self.block)
        if added:
            for bm in self.inner[j][r + 1:]:
                bm.add(slot)
            for bm in self.outer[j + 1:]:
                bm.add(slot)
        else:
            for bm in self.inner[j][r + 1:]:
                bm.discard(slot)
            for bm in self.outer[j + 1:]:
                bm.discard(slot)

    def reshaped(self) -> None:
        """A value appeared or disappeared: the blocks moved; rebuild at the next query."""
        self.version += 1
        self.stale = True

    def lower(self, h: int, keys: list[float], postings: dict[Scalar, BitMap]) -> BitMap:
        """Instances whose value is among the first `h` sorted values (may be one of this
        structure's own bitmaps or a posting: never mutate it)."""
        if h <= 0:
            return EMPTY
        if self.memo_version != self.version:
            self.memo = {}
            self.memo_version = self.version
        memo = self.memo
        hit = memo.pop(h, None)
        if hit is not None:
            memo[h] = hit  # most recently used last
            return hit
        if self.stale:
            self.rebuild(keys, postings)
        if not self.block:
            out = postings[keys[0]] if h == 1 else BitMap.union(*[postings[k] for k in keys[:h]])
        elif h >= len(keys):
            out = self.outer[-1]
        else:
            j, r = divmod(h, self.block)
            a = self.outer[j]
            if r:
                b = self.inner[j][r]
                out = b if not a else a | b
            else:
                out = a
        if len(memo) >= MEMO:
            del memo[next(iter(memo))]
        memo[h] = out
        return out

    def lower_within(self, h: int, keys: list[float], postings: dict[Scalar, BitMap], within: BitMap) -> BitMap:
        """`within & lower(h)` (a new bitmap) without the union `lower` would build: `within`
        met with each of the two prefixes (`outer[j]` and `inner[j][r]` are disjoint), which
        costs what `within` holds, not what the fleet holds."""
        if h <= 0:
            return EMPTY
        if self.memo_version == self.version:
            hit = self.memo.get(h)
            if hit is not None:
                return within & hit
        if self.stale:
            self.rebuild(keys, postings)
        if not self.block:
            return within & self.lower(h, keys, postings)
        if h >= len(keys):
            return within & self.outer[-1]
        j, r = divmod(h, self.block)
        out = within & self.outer[j]
        if r:
            out |= within & self.inner[j][r]
        return out
