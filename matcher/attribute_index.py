"""Inverted postings for one instance attribute, with an ordered key list for ranges.

Equality and set predicates read one or a few postings bitmaps; range predicates
(`slo_latency <= request.slo`) bisect the sorted distinct values and read the prefix
unions of `prefix_bitmaps.py` (one union of two bitmaps, however many distinct values),
complementing against the instances that have the attribute at all for `>` and `>=`.
`keys_version` changes whenever the set of distinct values does: a request reduced to its
position among the values (`FleetIndex.shape_key`) is only comparable under one version.
An ordered attribute also answers, for every slot at once, which of the sorted values it
holds (`key_positions`, a C int array kept up to date per add and remove, rebuilt only when
the values themselves change): what `threshold_ranks.py` groups a base's members by.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from typing import Iterable, cast

import numpy as np
from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

from .prefix_bitmaps import PrefixBitmaps

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

    __slots__ = ("attr", "ordered", "postings", "keys", "present", "prefix", "keys_version", "_positions",
                 "_positions_version")

    def __init__(self, attr: str, ordered: bool) -> None:
        self.attr = attr
        self.ordered = ordered
        self.postings: dict[Scalar, BitMap] = {}
        self.keys: list[float] = []  # sorted distinct values, when ordered
        self.present = BitMap()  # instances with a value, kept only when ordered
        self.prefix = PrefixBitmaps()  # range answers, when ordered
        self.keys_version = 0  # bumped when a distinct value appears or disappears
        self._positions = array("i")  # slot -> 1 + index in `keys` (0: no value), when ordered (`key_positions`)
        self._positions_version = -1  # the `keys_version` `_positions` is current for

    def add(self, slot: int, value: Scalar) -> None:
        bm = self.postings.get(value)
        if bm is None:
            bm = self.postings[value] = BitMap()
            if self.ordered:
                insort(self.keys, cast(float, value))  # an ordered attribute's values are numbers
                self.prefix.reshaped()
            self.keys_version += 1
        elif self.ordered:
            i = bisect_left(self.keys, value)  # type: ignore[arg-type]
            self.prefix.changed(i, slot, True)
            if self._positions_version == self.keys_version:
                self._place(slot, i)
        bm.add(slot)
        if self.ordered:
            self.present.add(slot)

    def remove(self, slot: int, value: Scalar) -> None:
        bm = self.postings.get(value)
        if bm is None or slot not in bm:
            return
        bm.discard(slot)
        if self.ordered:
            self.present.discard(slot)
        if not bm:
            del self.postings[value]
            self.keys_version += 1
            if self.ordered:
                i = bisect_left(self.keys, value)  # type: ignore[arg-type]
                del self.keys[i]
                self.prefix.reshaped()
        elif self.ordered:
            self.prefix.changed(bisect_left(self.keys, value), slot, False)  # type: ignore[arg-type]
            if self._positions_version == self.keys_version:
                self._positions[slot] = 0

    def bulk(self, pairs: Iterable[tuple[int, Scalar]]) -> None:
        """Fill an empty index at once (index build): lists first, bitmaps once."""
        lists: dict[Scalar, list[int]] = {}
        for slot, value in pairs:
            lists.setdefault(value, []).append(slot)
        self.postings = {v: BitMap(s) for v, s in lists.items()}
        self.present = union(list(self.postings.values())).copy() if self.ordered and self.postings else BitMap()
        if self.ordered:
            self.keys = sorted(cast("dict[float, BitMap]", self.postings))  # numbers, as in `add`
            self.prefix.reshaped()
        self.keys_version += 1

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
            self.keys = sorted(cast("dict[float, BitMap]", self.postings))  # numbers, as in `add`
            self.prefix.reshaped()
        self.keys_version += 1
        if self.ordered:
            self.key_positions()  # at the build (a few ms), not in the first request that needs them

    # ------------------------------------------------------------------ value positions
    def _place(self, slot: int, i: int) -> None:
        pos = self._positions
        if slot >= len(pos):
            pos.extend(array("i", [0]) * (max(1024, len(pos), slot + 1 - len(pos))))
        pos[slot] = i + 1

    def key_positions(self) -> array:
        """slot -> 1 + the index of its value in `keys` (0 for a slot without one; slots past
        the end have none either: counting from one lets `threshold_ranks.py` bin the
        positions as they are, without a shift), as a C int array: indexing it gives Python ints, and
        `numpy.frombuffer` views it without a copy (a view must not outlive the call that
        made it: the array grows in place). Rebuilt from the postings after the distinct
        values changed (a new SLO rolled out: O(instances) in numpy), else kept per update."""
        if self._positions_version != self.keys_version:
            top = max((bm.max() for bm in self.postings.values() if bm), default=-1)
            pos = np.zeros(max(1024, 2 * (top + 1)), dtype=np.intc)
            for i, k in enumerate(self.keys, 1):
                pos[np.frombuffer(self.postings[k].to_array(), dtype=np.uint32)] = i
            self._positions, self._positions_version = array("i", pos.tobytes()), self.keys_version
        return self._positions

    # ------------------------------------------------------------------ predicates
    def eq(self, value: Scalar) -> BitMap:
        return self.postings.get(value, EMPTY)

    def any_of(self, values: Iterable[Scalar]) -> BitMap:
        return union([bm for v in values if (bm := self.postings.get(v)) is not None])

    def order(self, cmp: str, value: float) -> BitMap:
        """Instances whose value satisfies `value_of_instance cmp value`."""
        if not self.ordered:  # an ordering on an attribute the plan did not mark as a range
            return self._order_unindexed(cmp, value)
        keys = self.keys
        if cmp == "<":  # `cut`, inlined: this runs on every request with a range term
            h, below = bisect_left(keys, value), True
        elif cmp == "<=":
            h, below = bisect_right(keys, value), True
        elif cmp == ">":
            h, below = bisect_right(keys, value), False
        elif cmp == ">=":
            h, below = bisect_left(keys, value), False
        else:
            raise ValueError(f"`{cmp}` is not an ordering")
        n = len(keys)
        if below:
            if h == 0:
                return EMPTY
            return self.present if h == n else self.prefix.lower(h, keys, self.postings)
        if h == n:
            return EMPTY
        return self.present if h == 0 else self.present - self.prefix.lower(h, keys, self.postings)

    def order_within(self, cmp: str, value: float, within: BitMap) -> BitMap:
        """`within & order(cmp, value)`, built from `within` (a few candidates) without
        building the range's own bitmap: a new range position would otherwise pay a union
        of two prefix bitmaps the size of the fleet."""
        if not self.ordered:
            return within & self._order_unindexed(cmp, value)
        keys = self.keys
        h, below = self.cut(cmp, value)
        n = len(keys)
        if below:
            if h == 0:
                return EMPTY
            return within & self.present if h == n else self.prefix.lower_within(h, keys, self.postings, within)
        if h == n:
            return EMPTY
        mine = within & self.present
        return mine if h == 0 else mine - self.prefix.lower_within(h, keys, self.postings, mine)

    def cut(self, cmp: str, value: float) -> tuple[int, bool]:
        """(h, below): the ordering holds for the first h sorted values (below) or the rest."""
        keys = self.keys
        if cmp == "<":
            return bisect_left(keys, value), True
        if cmp == "<=":
            return bisect_right(keys, value), True
        if cmp == ">":
            return bisect_right(keys, value), False
        if cmp == ">=":
            return bisect_left(keys, value), False
        raise ValueError(f"`{cmp}` is not an ordering")

    def position(self, value: float) -> int:
        """`value`'s place among the sorted values: 2i between values i - 1 and i, 2i + 1 at
        value i. Every ordering against `value` depends on this alone."""
        keys = self.keys
        i = bisect_left(keys, value)
        return 2 * i + (i < len(keys) and keys[i] == value)

    def _order_unindexed(self, cmp: str, value: float) -> BitMap:
        keys = sorted(k for k in self.postings if isinstance(k, (int, float)) and not isinstance(k, bool))
        if cmp == "<":
            sel = keys[:bisect_left(keys, value)]
        elif cmp == "<=":
            sel = keys[:bisect_right(keys, value)]
        elif cmp == ">":
            sel = keys[bisect_right(keys, value):]
        elif cmp == ">=":
            sel = keys[bisect_left(keys, value):]
        else:
            raise ValueError(f"`{cmp}` is not an ordering")
        return union([self.postings[k] for k in sel])
