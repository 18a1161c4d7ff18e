"""Decide's per-request-shape cache, keyed by the request's serialized bytes.

Callers repeat a few request shapes, and one client process writes the same message as
the same bytes, so the raw request is the cheapest exact key there is: a hit skips
protobuf parsing, header parsing and the solver's feasibility lookup (`Prepared`) and
carries the shape's `MatchMemo`. Protobuf leaves the order of a map's entries (the
headers) to the writer, though, and another process writes them in its own order: the
service keys a new shape by its canonical bytes (deterministic serialization: map entries
in key order) and keeps the bytes it came as beside them (`alias`), so a client's other
order costs one parse once, not the shape's whole preparation. A raw shape that is new
costs one parse; what comes after it is keyed by the *reduced* shape further down (the
matcher's plans, the solver's answers), so a new SLO value between two known thresholds
finds those warm.

Entries belong to one policy state. The table is a bounded LRU: when full, the least
recently used entry goes, one at a time (starting afresh made every warm shape cold
whenever a diverse mix filled it). A reload re-prepares every entry against the new state
off the loop (`rebuilt`) and swaps the warm table in (`adopt`). Only requests that parsed
cleanly are kept: bad input is re-examined (and refused) every time. An entry whose
feasibility answer was still pending takes the solver's answer once it is there.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

from policyc.matcher import AppliedRule
from policyc.solver.feasibility import Pending

from .convert import decision_bytes, decision_head, rejection_field
from .decision import Decision, Outcome, Rejection
from .prepared import MatchMemo, Prepared
from .state import PolicyState

if TYPE_CHECKING:
    from .engine import DecisionEngine

DEFAULT_MAX_SHAPES = 4096


class ShapeEntry:
    """One shape: its prepared request, its match memo, the serialized response head
    (`convert.decision_head`) with the (outcome, rules, candidates) it was made for, and
    the serialized rejection with the parts it was made of."""

    __slots__ = ("prepared", "memo", "head", "rejection")

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.memo = MatchMemo()
        self.head: tuple[Outcome, tuple[AppliedRule, ...], int, bytes] | None = None
        self.rejection: tuple[Rejection, bytes] | None = None

    def response(self, d: Decision) -> bytes:
        """`d` serialized, its head taken from this entry while the head fields stay the
        same (rules by identity: the match memo hands out the same tuple until the
        registry changes), and so is its rejection while its parts are the same objects
        (a solver's rejection is made of the shape's feasibility answer, a matcher's is
        the match memo's: both repeat; a placer's names GPUs and is written afresh)."""
        h = self.head
        if h is None or h[0] is not d.outcome or h[1] is not d.rules or h[2] != d.candidates:
            h = self.head = (d.outcome, d.rules, d.candidates, decision_head(d))
        r = d.rejection
        if r is None or r.gpus:
            return decision_bytes(d, h[3])
        kept = self.rejection
        if kept is None or not _same_parts(kept[0], r):
            kept = self.rejection = (r, rejection_field(r))
        return decision_bytes(d, h[3], kept[1])


def _same_parts(a: Rejection, b: Rejection) -> bool:
    return a is b or (a.stage is b.stage and a.reason is b.reason and a.rule_ids is b.rule_ids and a.spans is b.spans
                      and a.eliminations is b.eliminations and a.binding == b.binding and a.gpus == b.gpus)


class RequestShapes:
    """`get(state, raw)` → entry or None; `put(raw, prepared)` → entry."""

    def __init__(self, max_shapes: int = DEFAULT_MAX_SHAPES) -> None:
        if max_shapes < 1:
            raise ValueError(f"the request shape cache needs room for at least 1 shape, got {max_shapes}")
        self.max_shapes = max_shapes
        self._state: PolicyState | None = None
        self._table: OrderedDict[bytes, ShapeEntry] = OrderedDict()

    def __len__(self) -> int:
        """Byte strings kept (an entry kept under several counts for each)."""
        return len(self._table)

    def distinct(self) -> int:
        """Shapes kept (an entry kept under several byte strings counts once)."""
        return len({id(e) for e in list(self._table.values())})

    def get(self, state: PolicyState, raw: bytes) -> ShapeEntry | None:
        if state is not self._state:
            return None
        table = self._table
        entry = table.get(raw)
        if entry is not None:
            table.move_to_end(raw)
            prep = entry.prepared
            if type(prep.answer) is Pending:  # solved since? (a dict look-up; Z3 never runs here)
                answer = state.feasibility.cached(prep.request.vars)
                if answer is not None:
                    entry.prepared = replace(prep, answer=answer)
        return entry

    def rebuilt(self, engine: DecisionEngine, state: PolicyState) -> OrderedDict[bytes, ShapeEntry]:
        """Every entry prepared again against `state` (a reload's new one), in the same
        recency order: run off the loop, then `adopt`ed. Inputs the new bundle refuses
        are dropped (they are re-examined when they come again). An entry kept under
        several byte strings (`alias`) is prepared once and stays shared."""
        out: OrderedDict[bytes, ShapeEntry] = OrderedDict()
        again: dict[int, ShapeEntry | None] = {}  # id(old entry) -> its new entry (None: refused)
        for raw, entry in list(self._table.items()):
            if id(entry) not in again:
                try:
                    again[id(entry)] = ShapeEntry(engine.prepare(entry.prepared.input, state))
                except Exception:  # noqa: BLE001 - a refused input is simply not kept
                    again[id(entry)] = None
            new = again[id(entry)]
            if new is not None:
                out[raw] = new
        return out

    def adopt(self, state: PolicyState, table: OrderedDict[bytes, ShapeEntry]) -> None:
        """Serve `table` (from `rebuilt`) for `state`; entries the loop made for `state`
        meanwhile are kept too."""
        if self._state is state:
            for raw, entry in self._table.items():
                table[raw] = entry
        while len(table) > self.max_shapes:
            table.popitem(last=False)
        self._table = table
        self._state = state

    def forget(self) -> None:
        """Drop every shape (after a reload: the old state's entries would keep it alive
        until the next new shape)."""
        self._table = OrderedDict()
        self._state = None

    def alias(self, raw: bytes, entry: ShapeEntry) -> None:
        """Keep `entry` under `raw` too: other bytes of the same request (a map's entries
        in another order: protobuf leaves that order to the writer, and one client process
        writes the same message the same way, another its own way). An entry of another
        state than the table's is not kept."""
        if entry.prepared.state is not self._state:
            return
        table = self._table
        if raw not in table and len(table) >= self.max_shapes:
            table.popitem(last=False)  # the least recently used
        table[raw] = entry

    def put(self, raw: bytes, prepared: Prepared) -> ShapeEntry:
        table = self._table
        if prepared.state is not self._state:
            table = self._table = OrderedDict()  # a new table, not cleared in place: a reader may hold the old one
            self._state = prepared.state
        elif len(table) >= self.max_shapes:
            table.popitem(last=False)  # the least recently used
        entry = table[raw] = ShapeEntry(prepared)
        return entry
