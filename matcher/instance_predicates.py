"""Requirements that read no request value, compiled into predicates over one instance.

The index keeps such requirements materialised as bitmaps (`FleetIndex.static`) and so
evaluates each of them for every instance it registers. `semantics.require_holds` walks the
expression tree for that; these closures do the same work without the walk, which is most
of the cost of an `add`. The meaning is `semantics.require_holds(e, attrs, {})` exactly,
missing attributes included (`==`, `in` and orderings false; `!=`, `not_in` true).
"""

from __future__ import annotations

from typing import Callable, Mapping

from policyc.compiler.bundle import And, Atom, Const, Expr, Not, Or, Scalar, Var

from policyc.compiler.semantics import NEGATIVE_CMPS
from .guards import COMPARATORS

InstancePredicate = Callable[[Mapping[str, Scalar]], bool]


def compile_static(e: Expr) -> InstancePredicate:
    """`require_holds(e, attrs, {})` as a closure; `e` must read no request variable."""
    match e:
        case Atom(operand=Var()):
            raise ValueError(f"a requirement that reads a request value is not static: {e}")
        case Atom(attr=attr, cmp=c, operand=Const(value=const)):
            cmp = COMPARATORS[c]
            absent = c in NEGATIVE_CMPS

            def atom(attrs: Mapping[str, Scalar]) -> bool:
                have = attrs.get(attr)
                return absent if have is None else cmp(have, const)
            return atom
        case And(args=args):
            parts = tuple(compile_static(a) for a in args)
            return lambda attrs: all(p(attrs) for p in parts)
        case Or(args=args):
            parts = tuple(compile_static(a) for a in args)
            return lambda attrs: any(p(attrs) for p in parts)
        case Not(arg=arg):
            inner = compile_static(arg)
            return lambda attrs: not inner(attrs)
    raise ValueError(f"a request test in a requirement: {e}")


RowPredicate = Callable[[Mapping[str, Scalar], Mapping[str, Scalar]], bool]


def compile_row(e: Expr) -> RowPredicate:
    """`require_holds(e, attrs, vars)` as a closure of (attrs, vars), for checking one
    instance's row against a request (`FleetIndex.row_admits`); the request must carry
    every variable `e` reads (the rule applies)."""
    match e:
        case Atom(attr=attr, cmp=c, operand=Var(name=name)):
            cmp = COMPARATORS[c]
            absent = c in NEGATIVE_CMPS

            def var_atom(attrs: Mapping[str, Scalar], vars: Mapping[str, Scalar]) -> bool:
                have = attrs.get(attr)
                return absent if have is None else cmp(have, vars[name])
            return var_atom
        case Atom(operand=Const()):
            static = compile_static(e)
            return lambda attrs, vars: static(attrs)
        case And(args=args):
            parts = tuple(compile_row(a) for a in args)
            return lambda attrs, vars: all(p(attrs, vars) for p in parts)
        case Or(args=args):
            parts = tuple(compile_row(a) for a in args)
            return lambda attrs, vars: any(p(attrs, vars) for p in parts)
        case Not(arg=arg):
            inner = compile_row(arg)
            return lambda attrs, vars: not inner(attrs, vars)
    raise ValueError(f"a request test in a requirement: {e}")
