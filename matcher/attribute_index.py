"""Inverted postings for one instance attribute, with an ordered key list for ranges.

Equality and set predicates read one or a few postings bitmaps; range predicates
(`slo_latency <= request.slo`) bisect the sorted distinct values and union the smaller
side, complementing against the instances that have the attribute at all. Contract-level
quantities (SLO, FLOPs, bandwidth) have few distinct values, so the unions are short.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Iterable

from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

EMPTY = BitMap()


def union(bitmaps: list[BitMap]) -> BitMap:
    if not bitmaps:
        return BitMap()
    if len(bitmaps) == 1:
        return bitmaps[0]
    return BitMap.union(*bitmaps)


class AttributeIndex:
    """Postings for one attribute. Returned bitmaps may be the index's own: callers combine
    them with non-mutating operators only."""

    __slots__ = ("attr", "ordered", "postings", "keys", "present")

    def __init__(self, attr: str, ordered: bool) -> None:
        self.attr = attr
        self.ordered = ordered
        self.postings: dict[Scalar, BitMap] = {}
        self.keys: list[float] = []  # sorted distinct values, when ordered
        self.present = BitMap()  # instances with a value, kept only when ordered

    def add(self, slot: int, value: Scalar) -> None:
        bm = self.postings.get(value)
        if bm is None:
            bm = self.postings[value] = BitMap()
            if self.ordered:
                insort(self.keys, value)  # type: ignore[arg-type]
        bm.add(slot)
        if self.ordered:
            self.present.add(slot)

    def remove(self, slot: int, value: Scalar) -> None:
        bm = self.postings.get(value)
        if bm is None:
            return
        bm.discard(slot)
        if self.ordered:
            self.present.discard(slot)
        if not bm:
            del self.postings[value]
            if self.ordered:
                i = bisect_left(self.keys, value)  # type: ignore[arg-type]
                del self.keys[i]

    def bulk(self, pairs: Iterable[tuple[int, Scalar]]) -> None:
        """Fill an empty index at once (index build): lists first, bitmaps once."""
        lists: dict[Scalar, list[int]] = {}
        for slot, value in pairs:
            lists.setdefault(value, []).append(slot)
        self.postings = {v: BitMap(s) for v, s in lists.items()}
        self.present = union(list(self.postings.values())).copy() if self.ordered and self.postings else BitMap()
        if self.ordered:
            self.keys = sorted(self.postings)  # type: ignore[type-var]

    def bulk_groups(self, groups: Iterable[tuple[Scalar, list[int]]]) -> None:
        """`bulk` from (value, slots) groups. Each list is sorted first: the groups are
        ascending runs, which sort almost for free, and pyroaring builds a bitmap from a
        sorted list about five times faster than from an unsorted one."""
        lists: dict[Scalar, list[int]] = {}
        for value, slots in groups:
            lists.setdefault(value, []).extend(slots)
        self.postings = {v: BitMap(sorted(s)) for v, s in lists.items()}
        self.present = union(list(self.postings.values())).copy() if self.ordered and self.postings else BitMap()
        if self.ordered:
            self.keys = sorted(self.postings)  # type: ignore[type-var]

    # ------------------------------------------------------------------ predicates
    def eq(self, value: Scalar) -> BitMap:
        return self.postings.get(value, EMPTY)

    def any_of(self, values: Iterable[Scalar]) -> BitMap:
        return union([bm for v in values if (bm := self.postings.get(v)) is not None])

    def order(self, cmp: str, value: float) -> BitMap:
        """Instances whose value satisfies `value_of_instance cmp value`."""
        keys = self.keys
        present = self.present
        if not self.ordered:  # an ordering on an attribute the plan did not mark as a range
            keys = sorted(k for k in self.postings if isinstance(k, (int, float)) and not isinstance(k, bool))
            present = union([self.postings[k] for k in keys])
        if cmp == "<":
            lo, hi = 0, bisect_left(keys, value)
        elif cmp == "<=":
            lo, hi = 0, bisect_right(keys, value)
        elif cmp == ">":
            lo, hi = bisect_right(keys, value), len(keys)
        elif cmp == ">=":
            lo, hi = bisect_left(keys, value), len(keys)
        else:
            raise ValueError(f"`{cmp}` is not an ordering")
        n = hi - lo
        if n == 0:
            return EMPTY
        if n == len(keys):
            return present
        post = self.postings
        if 2 * n <= len(keys):
            return union([post[k] for k in keys[lo:hi]])
        rest = keys[:lo] + keys[hi:]
        return present - union([post[k] for k in rest])
