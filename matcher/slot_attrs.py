"""slot -> attribute view, without a dict per instance where the rows can be rebuilt.

The index reads an instance's attributes when it is inserted, deleted, explained or
listed, never on a request's path. A dict per instance costs ~0.5 KB (0.5 GB at a million),
so the instances a bulk registration brings are kept as rows (`rows`: the registry
rebuilds a view from the instance's columns and its admission signature's shared
attributes); those inserted one at a time keep the dict they came with (`own`).
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

import numpy as np
from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

Attrs = Mapping[str, Scalar]


class SlotAttrs(Mapping[int, Attrs]):
    __slots__ = ("own", "lazy", "rows", "shared")

    def __init__(self) -> None:
        self.own: dict[int, Attrs] = {}
        self.lazy = BitMap()  # slots whose view `rows` rebuilds
        self.rows: Callable[[int], Attrs] | None = None
        # slot -> its row group's attributes (one member's, shared: equal to every member's
        # on each attribute the rules read), or None; what `peek` answers with
        self.shared = np.empty(0, dtype=object)

    def set_rows(self, slots: BitMap, rows: Callable[[int], Attrs]) -> None:
        """`slots`' views come from `rows(slot)` from now on."""
        self.lazy |= slots
        self.rows = rows

    def share(self, groups: list[tuple[Attrs, np.ndarray]]) -> None:
        """Each group's slots read by `peek` as the group's attributes (one scatter)."""
        if not groups:
            return
        sizes = np.fromiter((len(s) for _, s in groups), dtype=np.int64, count=len(groups))
        slots = np.concatenate([s for _, s in groups])
        if not len(slots):
            return
        top = int(slots.max())
        if top >= len(self.shared):
            grown = np.empty(max(top + 1, 2 * len(self.shared)), dtype=object)
            grown[:len(self.shared)] = self.shared
            self.shared = grown
        attrs = np.fromiter((a for a, _ in groups), dtype=object, count=len(groups))
        self.shared[slots] = attrs[np.repeat(np.arange(len(groups)), sizes)]

    def peek(self, slot: int) -> Attrs:
        """A mapping with `slot`'s value of every attribute the rules read: its own dict, or
        its row group's shared attributes (never mutate what this returns)."""
        a = self.own.get(slot)
        if a is None:
            shared = self.shared
            a = shared[slot] if slot < len(shared) else None
            if a is None:
                return self[slot]
        return a

    def __getitem__(self, slot: int) -> Attrs:
        a = self.own.get(slot)
        if a is not None:
            return a
        if slot in self.lazy and self.rows is not None:
            return self.rows(slot)
        raise KeyError(slot)

    def __setitem__(self, slot: int, attrs: Attrs) -> None:
        self.own[slot] = attrs
        self.lazy.discard(slot)
        if slot < len(self.shared):
            self.shared[slot] = None

    def pop(self, slot: int) -> Attrs:  # type: ignore[override]
        a = self[slot]
        self.own.pop(slot, None)
        self.lazy.discard(slot)
        if slot < len(self.shared):
            self.shared[slot] = None
        return a

    def __contains__(self, slot: object) -> bool:
        return slot in self.own or isinstance(slot, int) and slot in self.lazy

    def __len__(self) -> int:
        return len(self.own) + len(self.lazy)

    def __iter__(self) -> Iterator[int]:
        yield from self.own
        yield from self.lazy
