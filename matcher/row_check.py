"""Checking one instance against a request on its own row (`Registry.admits`).

A check by id must cost less than anything built for the request: a dict lookup for the
slot, then a few reads of the slot's row. Each live slot keeps one `Row`, a plain tuple in
a plain Python list: (its attributes, a bitmask of the bundle's static requirements, those
that read no request value, it meets, then the value of each attribute a requirement
compares with a request variable, in a fixed order; None where it has none). A numpy read
costs ~100 ns a scalar, a roaring bitmap probe ~100 ns and a dict lookup by name ~40 ns; a
list's or a tuple's read by position ~10 ns. The instances of one index group (a bulk
load's instances that agree on every attribute the rules read) share one tuple, so the
list costs 8 bytes a slot.

A rule shape (the rules that apply to requests like this one) is compiled once into a
`RowCheck`: Python source made for the shape, with the static requirements as one mask
test and, per plain atom (an attribute compared with a request variable), one read by
position and one comparison written inline; anything else is the closure `compile_row`
makes, called on the attributes. Names enter the source only as `repr` literals. The
meaning is `semantics.require_holds` of every applying rule's requirement on the row,
exactly: `tests/matcher/test_differential.py` holds `admits` of every instance to the
naive scan on rules of every shape (`!=`, `not in`, `or`, `not`, labels present or absent)
through adds, removals and updates, `tests/matcher/test_fleet_scale.py` on generated
fleets.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from policyc.compiler.bundle import And, Atom, RequestRule, Scalar, Var
from policyc.compiler.semantics import NEGATIVE_CMPS

from .instance_predicates import InstancePredicate, RowPredicate, compile_row

Attrs = Mapping[str, Scalar]
Row = tuple[Any, ...]  # (attributes, mask of the static requirements met, value per read attribute...)
RowFn = Callable[[Row, Mapping[str, Scalar]], bool]  # a compiled check (`RowCheck`)
FIRST = 2  # the position of the first attribute value in a row
# the Python operator of each comparator of a plain atom: `guards.COMPARATORS`' operations
_INLINE = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "in": "in", "not_in": "not in"}
_COMPILED: dict[tuple, RowFn] = {}  # a check's shape -> its compiled function, shared by every index
COMPILED_MOST = 4096


class RowFacts:
    """slot -> `Row`, or None for a slot with no live instance."""

    __slots__ = ("rows", "names", "position", "_static")

    def __init__(self, static: Sequence[InstancePredicate], names: Iterable[str]) -> None:
        self.rows: list[Row | None] = []
        self.names = tuple(names)  # the attributes a row carries, in order
        self.position = {a: FIRST + i for i, a in enumerate(self.names)}
        self._static = tuple(static)

    def row(self, attrs: Attrs, mask: int | None = None) -> Row:
        """The row of an instance with these attributes (`mask`: its static requirements'
        verdicts when the caller has them)."""
        if mask is None:
            mask = 0
            for i, holds in enumerate(self._static):
                if holds(attrs):
                    mask |= 1 << i
        return (attrs, mask, *map(attrs.get, self.names))

    def _grow(self, size: int) -> None:
        rows = self.rows
        if size > len(rows):  # by an eighth at least: amortised, without doubling a million-slot list at one add
            rows.extend([None] * (max(size, len(rows) + len(rows) // 8 + 64) - len(rows)))

    def put(self, slot: int, attrs: Attrs) -> None:
        self._grow(slot + 1)
        self.rows[slot] = self.row(attrs)

    def drop(self, slot: int) -> None:
        if slot < len(self.rows):
            self.rows[slot] = None

    def fill(self, groups: Iterable[tuple[Row, Sequence[int]]]) -> None:
        """Each group's slots get its row (a bulk load: the instances of a group agree on
        every attribute the rules read, so they share one tuple)."""
        groups = [(r, s) for r, s in groups if len(s)]
        if not groups:
            return
        self._grow(max(max(s) for _, s in groups) + 1)
        rows = self.rows
        for row, slots in groups:
            for s in slots:
                rows[s] = row


class RowCheck:
    """The applying rules of one request shape, compiled for one row: `fn(row, vars)`, where
    `vars` carries every variable the requirements read (the rules apply)."""

    __slots__ = ("need", "parts", "fn")

    def __init__(self, rules: Iterable[RequestRule], static_bit: Mapping[str, int], position: Mapping[str, int]) -> None:
        need = 0
        parts: list[tuple[int, str, str, bool] | RowPredicate] = []
        for rule in rules:
            bit = static_bit.get(rule.id)
            if bit is not None:
                need |= 1 << bit
                continue
            e = rule.require
            for p in (e.args if isinstance(e, And) else (e,)):
                if isinstance(p, Atom) and isinstance(p.operand, Var) and p.cmp in _INLINE and p.attr in position:
                    parts.append((position[p.attr], str(p.cmp), p.operand.name, p.cmp in NEGATIVE_CMPS))
                else:
                    parts.append(compile_row(p))
        self.need = need
        self.parts = tuple(parts)
        self.fn = _compile(need, self.parts)


def _compile(need: int, parts: tuple[tuple[int, str, str, bool] | RowPredicate, ...]) -> RowFn:
    closures = any(not isinstance(p, tuple) for p in parts)
    shape = (need, parts)
    fn = None if closures else _COMPILED.get(shape)
    if fn is not None:
        return fn
    lines = ["def check(row, v):"]
    if need:
        lines.append(f"    if row[1] & {need} != {need}: return False")
    namespace: dict[str, Any] = {}
    for i, p in enumerate(parts):
        if isinstance(p, tuple):
            pos, cmp, var, absent = p
            lines.append(f"    x = row[{int(pos)}]")
            test = f"x {_INLINE[cmp]} v[{var!r}]"
            if absent:  # a missing attribute meets a negative comparison
                lines.append(f"    if x is not None and not ({test}): return False")
            else:
                lines.append(f"    if x is None or not ({test}): return False")
        else:
            namespace[f"c{i}"] = p
            lines.append(f"    if not c{i}(row[0], v): return False")
    lines.append("    return True")
    exec(compile("\n".join(lines), "<row check>", "exec"), namespace)  # noqa: S102 - names by repr only
    fn = namespace["check"]
    if not closures:
        if len(_COMPILED) >= COMPILED_MOST:
            _COMPILED.clear()
        _COMPILED[shape] = fn
    return fn  # type: ignore[no-any-return]
