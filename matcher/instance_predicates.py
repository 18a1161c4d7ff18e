"""Requirements that read no request value, compiled into predicates over one instance.

The index keeps such requirements materialised as bitmaps (`FleetIndex.static`) and so
evaluates each of them for every instance it registers. `semantics.require_holds` walks the
expression tree for that; these closures do the same work without the walk, which is most
of the cost of an `add`. The meaning is `semantics.require_holds(e, attrs, {})` exactly,
missing attributes included (`==`, `in` and orderings false; `!=`, `not_in` true).
"""

from __future__ import annotations

from typing import Callable, Mapping

from policyc.compiler.bundle import Expr, Scalar

from policyc.compiler.semantics import NEGATIVE_CMPS
from .guards import COMPARATORS

InstancePredicate = Callable[[Mapping[str, Scalar]], bool]


def compile_static(e: Expr) -> InstancePredicate:
    """`require_holds(e, attrs, {})` as a closure; `e` must read no request variable."""
    if e.op == "atom":
        if e.operand.kind != "const":
            raise ValueError(f"a requirement that reads a request value is not static: {e}")
        attr = e.attr
        cmp = COMPARATORS[e.cmp]
        const = e.operand.value
        absent = e.cmp in NEGATIVE_CMPS

        def atom(attrs: Mapping[str, Scalar]) -> bool:
            have = attrs.get(attr)
            return absent if have is None else cmp(have, const)
        return atom
    if e.op == "and":
        parts = tuple(compile_static(a) for a in e.args)
        return lambda attrs: all(p(attrs) for p in parts)
    if e.op == "or":
        parts = tuple(compile_static(a) for a in e.args)
        return lambda attrs: any(p(attrs) for p in parts)
    if e.op == "not":
        inner = compile_static(e.arg)
        return lambda attrs: not inner(attrs)
    raise ValueError(f"a request test in a requirement: {e}")
