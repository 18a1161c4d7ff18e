"""slot -> attribute view, without a dict per instance where the rows can be rebuilt.

The index reads an instance's attributes when it is inserted, deleted, explained or
listed, never on a request's path. A dict per instance costs ~0.5 KB (0.5 GB at a million),
so the instances a bulk registration brings are kept as rows (`rows`: the registry
rebuilds a view from the instance's columns and its admission signature's shared
attributes); those inserted one at a time keep the dict they came with (`own`). A check of
one row reads its facts elsewhere (`row_check.py`).
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

from pyroaring import BitMap

from policyc.compiler.bundle import Scalar

Attrs = Mapping[str, Scalar]


class SlotAttrs(Mapping[int, Attrs]):
    __slots__ = ("own", "lazy", "rows")

    def __init__(self) -> None:
        self.own: dict[int, Attrs] = {}
        self.lazy = BitMap()  # slots whose view `rows` rebuilds
        self.rows: Callable[[int], Attrs] | None = None

    def set_rows(self, slots: BitMap, rows: Callable[[int], Attrs]) -> None:
        """`slots`' views come from `rows(slot)` from now on."""
        self.lazy |= slots
        self.rows = rows

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

    def pop(self, slot: int) -> Attrs:  # type: ignore[override]
        a = self[slot]
        self.own.pop(slot, None)
        self.lazy.discard(slot)
        return a

    def __contains__(self, slot: object) -> bool:
        return slot in self.own or isinstance(slot, int) and slot in self.lazy

    def __len__(self) -> int:
        return len(self.own) + len(self.lazy)

    def __iter__(self) -> Iterator[int]:
        yield from self.own
        yield from self.lazy
