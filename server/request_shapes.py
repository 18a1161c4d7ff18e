"""Decide's per-request-shape cache, keyed by the request's serialized bytes.

Callers repeat a few request shapes, and protobuf writes the same message as the same
bytes, so the raw request is the cheapest exact key there is: a hit skips protobuf
parsing, header parsing and the solver's feasibility lookup (`Prepared`) and carries the
shape's `MatchMemo`. Entries belong to one policy state; a reload starts a new table.
Only requests that parsed cleanly are kept: bad input is re-examined (and refused) every
time. The table is bounded; when full it starts afresh (a shape costs one parse to
re-enter), which is cheaper per call than keeping recency order.
"""

from __future__ import annotations

from policyc.matcher import AppliedRule

from .convert import decision_bytes, decision_head
from .decision import Decision, Outcome
from .prepared import MatchMemo, Prepared
from .state import PolicyState

DEFAULT_MAX_SHAPES = 4096


class ShapeEntry:
    """One shape: its prepared request, its match memo, and the serialized response head
    (`convert.decision_head`) with the (outcome, rules, candidates) it was made for."""

    __slots__ = ("prepared", "memo", "head")

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.memo = MatchMemo()
        self.head: tuple[Outcome, tuple[AppliedRule, ...], int, bytes] | None = None

    def response(self, d: Decision) -> bytes:
        """`d` serialized, its head taken from this entry while the head fields stay the
        same (rules by identity: the match memo hands out the same tuple until the
        registry changes)."""
        h = self.head
        if h is None or h[0] is not d.outcome or h[1] is not d.rules or h[2] != d.candidates:
            h = self.head = (d.outcome, d.rules, d.candidates, decision_head(d))
        return decision_bytes(d, h[3])


class RequestShapes:
    """`get(state, raw)` → entry or None; `put(raw, prepared)` → entry."""

    def __init__(self, max_shapes: int = DEFAULT_MAX_SHAPES) -> None:
        if max_shapes < 1:
            raise ValueError(f"the request shape cache needs room for at least 1 shape, got {max_shapes}")
        self.max_shapes = max_shapes
        self._state: PolicyState | None = None
        self._table: dict[bytes, ShapeEntry] = {}

    def __len__(self) -> int:
        return len(self._table)

    def get(self, state: PolicyState, raw: bytes) -> ShapeEntry | None:
        if state is not self._state:
            return None
        return self._table.get(raw)

    def forget(self) -> None:
        """Drop every shape (after a reload: the old state's entries would keep it alive
        until the next new shape)."""
        self._table = {}
        self._state = None

    def put(self, raw: bytes, prepared: Prepared) -> ShapeEntry:
        table = self._table
        if prepared.state is not self._state:
            table = self._table = {}  # a new table, not cleared in place: a reader may hold the old one
            self._state = prepared.state
        elif len(table) >= self.max_shapes:
            table = self._table = {}
        entry = table[raw] = ShapeEntry(prepared)
        return entry
