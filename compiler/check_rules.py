"""The shape and types of request rules, checked on the IR.

`rules.py` type-checks rules on the syntax tree and can only produce well-formed IR; this
pass states the same typing over the IR itself, for the bundle loaders (`revalidate.py`)
and as the compiler's own last word (`resolve` runs it): a guard holds request tests
only, a requirement instance comparisons only; every attribute is one the matcher knows
(an unknown attribute in an edited bundle once changed live decisions), every request
variable is declared, every constant has the type of what it is compared with, and no
expression is deeper or wider than `limits` allows. The walk is iterative, so even a
hostile bundle cannot make it recurse.
"""

from __future__ import annotations

from typing import Iterable

from policyc.compiler.diagnostic import Diagnostic, error

from . import limits
from .attributes import BUILTIN_REQUEST_VARS, attribute_type
from .bundle import And, Atom, Const, Expr, HeaderMapping, Not, Or, RequestRule, SourceRef, Tenant, Test
from .check_values import finite, span

QUANTITY_TYPES = frozenset({"time", "bandwidth", "flops", "ratio", "count", "size"})
ORDERINGS = frozenset({"<", "<=", ">", ">="})


def _scalar_ok(v: object, t: str) -> bool:
    if t in QUANTITY_TYPES:
        return finite(v)  # type: ignore[arg-type]
    if t == "bool":
        return isinstance(v, bool)
    return isinstance(v, str)


class _RuleChecker:
    def __init__(self, headers: Iterable[HeaderMapping], tenants: Iterable[Tenant], diags: list[Diagnostic]) -> None:
        hs = list(headers)
        self.vars = {**BUILTIN_REQUEST_VARS, **{h.var: h.type for h in hs}}
        self.values = {h.var: h.values for h in hs if h.values}
        self.classes = {t.tenant_class for t in tenants}
        self.diags = diags

    def err(self, code: str, message: str, where: SourceRef) -> None:
        self.diags.append(error(code, message, span(where)))

    def rule(self, r: RequestRule) -> None:
        if r.guard is not None:
            self.walk(r, r.guard, guard=True)
        self.walk(r, r.require, guard=False)

    def walk(self, r: RequestRule, root: Expr, guard: bool) -> None:
        stack: list[tuple[Expr, int]] = [(root, 1)]
        while stack:
            e, depth = stack.pop()
            if depth > limits.MAX_DEPTH:
                self.err("E105", f"rule `{r.id}` nests deeper than {limits.MAX_DEPTH} levels", r.origin)
                return
            if isinstance(e, (And, Or)):
                if not 1 <= len(e.args) <= limits.MAX_TERMS:
                    self.err("E106", f"rule `{r.id}` has an `{e.op}` of {len(e.args)} terms (1 to {limits.MAX_TERMS})", r.origin)
                    return
                stack.extend((a, depth + 1) for a in e.args)
            elif isinstance(e, Not):
                stack.append((e.arg, depth + 1))
            elif isinstance(e, Test):
                if not guard:
                    self.err("E408", f"rule `{r.id}`: `require` constrains the instance, and holds a request test", e.origin)
                else:
                    self.test(r, e)
            elif isinstance(e, Atom):
                if guard:
                    self.err("E406", f"rule `{r.id}`: `when` reads the request only, and holds `{e.attr}`", e.origin)
                else:
                    self.atom(r, e)

    def test(self, r: RequestRule, t: Test) -> None:
        vt = self.vars.get(t.var)
        if vt is None:
            self.err("E402", f"unknown request variable `{t.var}` in rule `{r.id}`", t.origin)
        elif (t.cmp is None) != (t.operand is None):
            self.err("E602", f"rule `{r.id}`: a request test has a comparison without a value, or the reverse", t.origin)
        elif t.cmp is not None and t.operand is not None:
            self.const(r, t.cmp, t.operand, vt, f"request.{t.var}", t.var, t.origin)

    def atom(self, r: RequestRule, a: Atom) -> None:
        t = attribute_type(a.attr)
        if t is None:
            self.err("E410", f"unknown instance attribute `{a.attr}` in rule `{r.id}`", a.origin)
            return
        if a.operand.kind == "var":
            vt = self.vars.get(a.operand.name)
            if vt is None:
                self.err("E402", f"unknown request variable `{a.operand.name}` in rule `{r.id}`", a.origin)
            elif vt != t and not ({vt, t} <= {"name", "string"}):
                self.err("E319", f"`{a.attr}` is {t} but `request.{a.operand.name}` is {vt} in rule `{r.id}`", a.origin)
            elif a.cmp in ("in", "not_in"):
                self.err("E320", f"`in` takes a list, and `request.{a.operand.name}` is one value (rule `{r.id}`)", a.origin)
            elif a.cmp in ORDERINGS and t not in QUANTITY_TYPES:
                self.err("E321", f"`{a.cmp}` orders quantities, and `{a.attr}` is {t} (rule `{r.id}`)", a.origin)
            return
        self.const(r, a.cmp, a.operand, t, a.attr, None, a.origin)

    def const(self, r: RequestRule, cmp: str, c: Const, t: str, what: str, var: str | None, at: SourceRef) -> None:
        if cmp in ORDERINGS and t not in QUANTITY_TYPES:
            self.err("E321", f"`{cmp}` orders quantities, and `{what}` is {t} (rule `{r.id}`)", at)
            return
        listed = cmp in ("in", "not_in")
        if listed != isinstance(c.value, tuple):
            self.err("E320" if listed else "E322", f"`{cmp}` in rule `{r.id}` takes {'a list' if listed else 'one value'}", at)
            return
        items = c.value if isinstance(c.value, tuple) else (c.value,)
        if len(items) > limits.MAX_TERMS:
            self.err("E106", f"rule `{r.id}` compares with a list of {len(items)} values (at most {limits.MAX_TERMS})", at)
            return
        for v in items:
            if not _scalar_ok(v, t):
                self.err("E301", f"`{what}` is {t}, and rule `{r.id}` compares it with `{str(v)[:64]}`", at)
                return
            if var == "tenant_class" and v not in self.classes:
                self.err("E411", f"no tenant has class `{v}` (rule `{r.id}`)", at)
                return
            allowed = self.values.get(var or "", ())
            if allowed and v not in allowed:
                self.err("E310", f"`{v}` is not a declared value of `request.{var}` (rule `{r.id}`)", at)
                return


def check_rules(rules: Iterable[RequestRule], headers: Iterable[HeaderMapping], tenants: Iterable[Tenant],
                diags: list[Diagnostic]) -> None:
    """Append a diagnostic for every rule the compiler's type checker would not have produced."""
    ch = _RuleChecker(headers, tenants, diags)
    for r in rules:
        ch.rule(r)
