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

from typing import Iterable, Mapping

from policyc.compiler.bundle import Atom, Expr, RequestRule, Scalar, Test

NEGATIVE_CMPS = frozenset({"!=", "not_in"})


def compare(left: Scalar, cmp: str, right: Scalar | tuple[Scalar, ...]) -> bool:
    if cmp == "==":
        return left == right
    if cmp == "!=":
        return left != right
    if cmp == "in":
        return left in right  # type: ignore[operator]
    if cmp == "not_in":
        return left not in right  # type: ignore[operator]
    if cmp == "<":
        return left < right  # type: ignore[operator]
    if cmp == "<=":
        return left <= right  # type: ignore[operator]
    if cmp == ">":
        return left > right  # type: ignore[operator]
    if cmp == ">=":
        return left >= right  # type: ignore[operator]
    raise ValueError(f"unknown comparison `{cmp}`")


def atoms(e: Expr | None) -> Iterable[Atom]:
    """Every instance-attribute comparison in an expression, in source order."""
    if e is None:
        return
    if e.op == "atom":
        yield e  # type: ignore[misc]
    elif e.op in ("and", "or"):
        for a in e.args:  # type: ignore[union-attr]
            yield from atoms(a)
    elif e.op == "not":
        yield from atoms(e.arg)  # type: ignore[union-attr]


def value_reads(e: Expr | None) -> set[str]:
    """Request variables the expression reads (presence tests included)."""
    out: set[str] = set()
    _collect(e, out)
    return out


def _collect(e: Expr | None, out: set[str]) -> None:
    if e is None:
        return
    if e.op == "test":
        out.add(e.var)  # type: ignore[union-attr]
    elif e.op == "atom":
        if e.operand.kind == "var":  # type: ignore[union-attr]
            out.add(e.operand.name)  # type: ignore[union-attr]
    elif e.op in ("and", "or"):
        for a in e.args:  # type: ignore[union-attr]
            _collect(a, out)
    else:
        _collect(e.arg, out)  # type: ignore[union-attr]


def guard_holds(e: Expr, vars: Mapping[str, Scalar]) -> bool:
    """A guard over the request; callers have checked that every value it reads is present."""
    if e.op == "test":
        t: Test = e  # type: ignore[assignment]
        if t.cmp is None:
            return t.var in vars
        return compare(vars[t.var], t.cmp, t.operand.value)  # type: ignore[union-attr]
    if e.op == "and":
        return all(guard_holds(a, vars) for a in e.args)  # type: ignore[union-attr]
    if e.op == "or":
        return any(guard_holds(a, vars) for a in e.args)  # type: ignore[union-attr]
    if e.op == "not":
        return not guard_holds(e.arg, vars)  # type: ignore[union-attr]
    raise ValueError(f"an instance attribute in a guard: {e}")


def operand_value(a: Atom, vars: Mapping[str, Scalar]) -> Scalar | tuple[Scalar, ...]:
    return a.operand.value if a.operand.kind == "const" else vars[a.operand.name]  # type: ignore[union-attr]


def atom_holds(a: Atom, attrs: Mapping[str, Scalar], vars: Mapping[str, Scalar]) -> bool:
    have = attrs.get(a.attr)
    if have is None:
        return a.cmp in NEGATIVE_CMPS
    return compare(have, a.cmp, operand_value(a, vars))


def require_holds(e: Expr, attrs: Mapping[str, Scalar], vars: Mapping[str, Scalar]) -> bool:
    if e.op == "atom":
        return atom_holds(e, attrs, vars)  # type: ignore[arg-type]
    if e.op == "and":
        return all(require_holds(a, attrs, vars) for a in e.args)  # type: ignore[union-attr]
    if e.op == "or":
        return any(require_holds(a, attrs, vars) for a in e.args)  # type: ignore[union-attr]
    if e.op == "not":
        return not require_holds(e.arg, attrs, vars)  # type: ignore[union-attr]
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
