"""The reference semantics of request rules, one instance at a time.

The one definition of what a bundle's rules mean, kept beside the IR they are written in:
the matcher's index must reproduce it exactly (it is an optimisation, never a change of
meaning), the naive scan, `policyc test` and the differential tests evaluate it directly,
and the solver replays every Z3 verdict through it.

- A rule applies when every request variable it reads is present (any test in the guard,
  `has(request.X)` included, and any `request.X` operand in the requirement) and its guard
  holds. So a guard such as `not has(request.X)` never applies.
- An instance may serve the request iff every applicable rule's `require` holds on its
  attributes. A missing attribute (an absent label) makes `==`, `in` and orderings false
  and `!=`, `not_in` true.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

from policyc.compiler.bundle import And, Atom, Const, Expr, Not, Or, RequestRule, Scalar, Test, Var

from .meaning import NEGATIVE_CMPS, Cmp

__all__ = ["NEGATIVE_CMPS", "admits", "applicable_rules", "atom_holds", "atoms", "compare", "guard_holds",
           "operand_value", "require_holds", "rule_applies", "value_reads"]

Value = Scalar | tuple[Scalar, ...]


def compare(left: Scalar, cmp: str, right: Value) -> bool:
    """`left cmp right`: `in` and `not_in` take a tuple, the orderings two numbers or two
    names, as the type checker guarantees (the values are compared as they are)."""
    match cmp:
        case Cmp.EQ:
            return left == right
        case Cmp.NE:
            return left != right
        case Cmp.IN:
            return _has(right, left)
        case Cmp.NOT_IN:
            return not _has(right, left)
        case Cmp.LT:
            return bool(operator.lt(left, right))
        case Cmp.LE:
            return bool(operator.le(left, right))
        case Cmp.GT:
            return bool(operator.gt(left, right))
        case Cmp.GE:
            return bool(operator.ge(left, right))
    raise ValueError(f"unknown comparison `{cmp}`")


def _has(items: Any, item: Scalar) -> bool:
    return item in items


def atoms(e: Expr | None) -> Iterable[Atom]:
    """Every instance-attribute comparison in an expression, in source order."""
    match e:
        case Atom():
            yield e
        case And(args=args) | Or(args=args):
            for a in args:
                yield from atoms(a)
        case Not(arg=arg):
            yield from atoms(arg)


def value_reads(e: Expr | None) -> set[str]:
    """Request variables the expression reads (presence tests included)."""
    out: set[str] = set()
    _collect(e, out)
    return out


def _collect(e: Expr | None, out: set[str]) -> None:
    match e:
        case Test(var=var):
            out.add(var)
        case Atom(operand=Var(name=name)):
            out.add(name)
        case And(args=args) | Or(args=args):
            for a in args:
                _collect(a, out)
        case Not(arg=arg):
            _collect(arg, out)


def guard_holds(e: Expr, vars: Mapping[str, Scalar]) -> bool:
    """A guard over the request; callers have checked that every value it reads is present."""
    match e:
        case Test(var=var, cmp=None):
            return var in vars
        case Test(var=var, cmp=cmp, operand=Const(value=value)) if cmp is not None:
            return compare(vars[var], cmp, value)
        case And(args=args):
            return all(guard_holds(a, vars) for a in args)
        case Or(args=args):
            return any(guard_holds(a, vars) for a in args)
        case Not(arg=arg):
            return not guard_holds(arg, vars)
    raise ValueError(f"not a guard over the request: {e}")


def operand_value(a: Atom, vars: Mapping[str, Scalar]) -> Value:
    match a.operand:
        case Const(value=value):
            return value
        case Var(name=name):
            return vars[name]
    raise ValueError(f"an operand that is neither a constant nor a request variable: {a.operand}")


def atom_holds(a: Atom, attrs: Mapping[str, Scalar], vars: Mapping[str, Scalar]) -> bool:
    have = attrs.get(a.attr)
    if have is None:
        return a.cmp in NEGATIVE_CMPS
    return compare(have, a.cmp, operand_value(a, vars))


def require_holds(e: Expr, attrs: Mapping[str, Scalar], vars: Mapping[str, Scalar]) -> bool:
    match e:
        case Atom():
            return atom_holds(e, attrs, vars)
        case And(args=args):
            return all(require_holds(a, attrs, vars) for a in args)
        case Or(args=args):
            return any(require_holds(a, attrs, vars) for a in args)
        case Not(arg=arg):
            return not require_holds(arg, attrs, vars)
    raise ValueError(f"a request test in a requirement: {e}")


def rule_applies(rule: RequestRule, vars: Mapping[str, Scalar]) -> bool:
    if any(v not in vars for v in value_reads(rule.guard) | value_reads(rule.require)):
        return False
    return rule.guard is None or guard_holds(rule.guard, vars)


def applicable_rules(rules: Iterable[RequestRule], vars: Mapping[str, Scalar]) -> list[RequestRule]:
    return [r for r in rules if rule_applies(r, vars)]


def admits(rules: Iterable[RequestRule], attrs: Mapping[str, Scalar], vars: Mapping[str, Scalar]) -> bool:
    """Whether an instance with these attributes may serve a request with these variables,
    given the rules that apply (pass `applicable_rules(...)`)."""
    return all(require_holds(r.require, attrs, vars) for r in rules)
