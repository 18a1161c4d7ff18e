"""Request guards compiled once per bundle into plain closures.

`semantics.guard_holds` walks the pydantic expression tree on every call: attribute look-ups,
string compares on `op` and `cmp`, recursion. A request runs every rule's guard, so the
index compiles each guard (and the "every value it reads is present" check that decides
whether a rule applies at all) into one closure over `operator` functions. The meaning is
`semantics.rule_applies` exactly; the differential tests hold the two together.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping

from policyc.compiler.bundle import And, Const, Expr, Not, Or, RequestRule, Scalar, Test

from policyc.compiler.semantics import value_reads

Vars = Mapping[str, Scalar]
Predicate = Callable[[Vars], bool]


def _contains(left: Scalar, right: tuple[Scalar, ...]) -> bool:
    return left in right


def _not_contains(left: Scalar, right: tuple[Scalar, ...]) -> bool:
    return left not in right


COMPARATORS: dict[str, Callable[[Any, Any], Any]] = {  # operator functions: the values are typed by the checker
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge, "in": _contains, "not_in": _not_contains,
}


def compile_guard(e: Expr) -> Predicate:
    """`guard_holds(e, vars)` as a closure; callers have checked presence of every read."""
    match e:
        case Test(var=name, cmp=None):
            return lambda v: name in v
        case Test(var=name, cmp=c, operand=Const(value=const)) if c is not None:
            cmp = COMPARATORS[c]
            return lambda v: cmp(v[name], const)
        case And(args=args):
            parts = tuple(compile_guard(a) for a in args)
            return lambda v: all(p(v) for p in parts)
        case Or(args=args):
            parts = tuple(compile_guard(a) for a in args)
            return lambda v: any(p(v) for p in parts)
        case Not(arg=arg):
            inner = compile_guard(arg)
            return lambda v: not inner(v)
    raise ValueError(f"an instance attribute in a guard: {e}")


def compile_applies(rule: RequestRule) -> Predicate:
    """`semantics.rule_applies(rule, vars)` as a closure: every read present, guard true."""
    reads = tuple(sorted(value_reads(rule.guard) | value_reads(rule.require)))
    guard = compile_guard(rule.guard) if rule.guard is not None else None
    if len(reads) == 1:
        only = reads[0]
        if guard is None:
            return lambda v: only in v
        if isinstance(rule.guard, Test) and rule.guard.cmp is None and rule.guard.var == only:
            return lambda v: only in v  # `when: has(request.x)` reading only x
        return lambda v: only in v and guard(v)

    def applies(v: Vars) -> bool:
        for r in reads:
            if r not in v:
                return False
        return guard is None or guard(v)
    return applies
