"""Type-check and lower `policy` blocks: request rules → `RequestRule` expressions.

A rule reads: *when* the request looks like this (`when:`, over request variables only),
*require* every admitted instance to satisfy that (`require:`, over instance attributes,
compared with literals or request variables). Keeping the two sides apart is what makes a
rule indexable: the guard is evaluated once per request, the requirement becomes bitmap
algebra over the instance index. Units are checked here: `slo_latency <= 80 GB/s` is a type
error, not a silent false.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, did_you_mean, error
from policyc.dsl.source import Span

from . import units
from .attributes import INSTANCE_ATTRIBUTES, LABEL_PREFIX, attribute_type
from .bundle import And, Atom, Const, Expr, Not, Or, RequestRule, Test, ValueType, Var
from .meaning import Cmp
from .fields import BOOL_WORDS, BlockReader, ref, shape
from .value_types import QUANTITIES, Kind, kind_of

QUANTITY_TYPES = QUANTITIES  # the value-type table's quantities (`value_types.py`)
FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


@dataclass(frozen=True)
class RequestScope:
    """What the checker knows about the request side: variables, their types, their
    declared values (for names), and the tenant classes that exist."""

    vars: dict[str, ValueType]
    values: dict[str, tuple[str, ...]]
    tenant_classes: tuple[str, ...]


class _Fail(Exception):
    pass


def lower_policy(block: ast.Block, scope: RequestScope, diags: list[Diagnostic]) -> list[RequestRule]:
    if len(block.labels) != 1:
        diags.append(error("E207", "a policy is written `policy NAME { rule NAME { … } }`", block.kind_span))
        return []
    policy = block.labels[0].text
    r = BlockReader(block, f"policy `{policy}`", diags, fields=(), blocks=("rule",))
    out: list[RequestRule] = []
    seen: dict[str, int] = {}
    for rb in r.blocks.get("rule", []):
        if len(rb.labels) != 1:
            diags.append(error("E207", "a rule is written `rule NAME { when: …  require: … }`", rb.kind_span))
            continue
        name = rb.labels[0].text
        if name in seen:
            diags.append(error("E403", f"rule `{name}` is declared twice in policy `{policy}`", rb.labels[0].span,
                               f"first declared at line {seen[name]}"))
            continue
        seen[name] = rb.span.line
        rule = _rule(rb, policy, name, scope, diags)
        if rule is not None:
            out.append(rule)
    return out


def _rule(rb: ast.Block, policy: str, name: str, scope: RequestScope, diags: list[Diagnostic]) -> RequestRule | None:
    r = BlockReader(rb, f"rule `{policy}.{name}`", diags, fields=("when", "require"))
    when, require = r.single("when"), r.single("require", required=True)
    checker = _Checker(scope, diags)
    guard = checker.guard(when) if when is not None else None
    req = checker.require(require) if require is not None else None
    if checker.failed or req is None or (when is not None and guard is None):
        return None
    return RequestRule(id=f"{policy}.{name}", policy=policy, guard=guard, require=req, origin=ref(rb.span))


class _Checker:
    def __init__(self, scope: RequestScope, diags: list[Diagnostic]) -> None:
        self.scope = scope
        self.diags = diags
        self.failed = False

    def err(self, code: str, message: str, span: Span | None, help: str | None = None) -> NoReturn:
        self.diags.append(error(code, message, span, help))
        self.failed = True
        raise _Fail

    # ------------------------------------------------------------------ names
    def request_var(self, n: ast.Name) -> str | None:
        if n.parts[0] != "request":
            return None
        if len(n.parts) != 2:
            self.err("E402", f"`{n.dotted}` is not a request variable", n.span, "write `request.NAME`")
        var = n.parts[1]
        if var not in self.scope.vars:
            self.err("E402", f"unknown request variable `{var}`", n.span,
                     did_you_mean(var, self.scope.vars) or "declare it with a `header` mapping in a `request` block")
        return var

    def attribute(self, n: ast.Name) -> str | None:
        name = n.dotted
        return name if attribute_type(name) is not None else None

    # ------------------------------------------------------------------ guards
    def guard(self, v: ast.Value) -> Expr | None:
        try:
            return self._guard(v)
        except _Fail:
            return None

    def _guard(self, v: ast.Value) -> Expr:
        if isinstance(v, ast.And):
            return And(args=tuple(self._guard(a) for a in v.args))
        if isinstance(v, ast.Or):
            return Or(args=tuple(self._guard(a) for a in v.args))
        if isinstance(v, ast.Not):
            return Not(arg=self._guard(v.arg))
        if isinstance(v, ast.Call):
            if v.func != "has" or len(v.args) != 1 or not isinstance(v.args[0], ast.Name):
                self.err("E404", f"unknown function `{v.func}`" if v.func != "has" else "`has` takes one request variable",
                         v.span, "conditions may call `has(request.NAME)`")
            var = self.request_var(v.args[0])
            if var is None:
                self.err("E405", "`has` takes a request variable such as `request.slo`", v.args[0].span)
            return Test(var=var, origin=ref(v.span))
        if isinstance(v, ast.Name):
            var = self.request_var(v)
            if var is None:
                self._not_request(v)
            if kind_of(self.scope.vars[var]) is not Kind.FLAG:
                self.err("E317", f"`request.{var}` is {units.describe(self.scope.vars[var])}, not yes/no; compare it", v.span)
            return Test(var=var, cmp=Cmp.EQ, operand=Const(value=True), origin=ref(v.span))
        if isinstance(v, ast.Compare):
            left, op, right = v.left, v.op, v.right
            lvar = self.request_var(left) if isinstance(left, ast.Name) else None
            rvar = self.request_var(right) if isinstance(right, ast.Name) else None
            if lvar is None and rvar is not None and op in FLIP:
                left, right, lvar, op = right, left, rvar, FLIP[op]
            elif lvar is None:
                self._not_request(left if isinstance(left, ast.Name) else v)
            const = self.literal(right, self.scope.vars[lvar], op, f"request.{lvar}", var=lvar)
            return Test(var=lvar, cmp=Cmp(op), operand=const, origin=ref(v.span))
        self.err("E318", f"a `when` condition must be true or false, found {shape(v)}", v.span)
        raise AssertionError

    def _not_request(self, v: ast.Value) -> NoReturn:
        if isinstance(v, ast.Name) and self.attribute(v):
            self.err("E406", f"`when` reads the request only; `{v.dotted}` is an instance attribute", v.span,
                     "move this condition to `require`")
        self.err("E407", "a `when` condition compares a request variable (`request.NAME`)", v.span)

    # ------------------------------------------------------------------ requirements
    def require(self, v: ast.Value) -> Expr | None:
        try:
            return self._require(v)
        except _Fail:
            return None

    def _require(self, v: ast.Value) -> Expr:
        if isinstance(v, ast.And):
            return And(args=tuple(self._require(a) for a in v.args))
        if isinstance(v, ast.Or):
            return Or(args=tuple(self._require(a) for a in v.args))
        if isinstance(v, ast.Not):
            return Not(arg=self._require(v.arg))
        if isinstance(v, ast.Name):
            attr = self.attribute(v)
            if attr is None:
                self._unknown_attribute(v)
            if kind_of(attribute_type(attr)) is not Kind.FLAG:  # type: ignore[arg-type]
                self.err("E317", f"`{attr}` is {units.describe(attribute_type(attr))}, not yes/no; compare it", v.span)  # type: ignore[arg-type]
            return Atom(attr=attr, cmp="==", operand=Const(value=True), origin=ref(v.span))  # type: ignore[arg-type]
        if isinstance(v, ast.Compare):
            left, op, right = v.left, v.op, v.right
            lattr = self.attribute(left) if isinstance(left, ast.Name) and left.parts[0] != "request" else None
            if lattr is None:
                rattr = self.attribute(right) if isinstance(right, ast.Name) and right.parts[0] != "request" else None
                if rattr is None or op not in FLIP:
                    if isinstance(left, ast.Name) and left.parts[0] == "request":
                        self.err("E408", f"`require` constrains the instance; `{left.dotted}` is the request", left.span,
                                 "put the attribute on the left, e.g. `slo_latency <= request.slo`, or move a condition on the request to `when`")
                    if isinstance(left, ast.Name):
                        self._unknown_attribute(left)
                    self.err("E409", "a requirement compares an instance attribute", v.span,
                             f"known attributes: {', '.join(sorted(INSTANCE_ATTRIBUTES))}")
                left, right, lattr, op = right, left, rattr, FLIP[op]
            t = attribute_type(lattr)
            if isinstance(right, ast.Name) and right.parts[0] == "request":
                var = self.request_var(right)
                vt = self.scope.vars[var]  # type: ignore[index]
                if vt != t and not ({kind_of(vt), kind_of(t)} <= {Kind.NAME, Kind.TEXT}):  # type: ignore[arg-type]
                    self.err("E319", f"`{lattr}` is {units.describe(t)} but `request.{var}` is {units.describe(vt)}", v.span)  # type: ignore[arg-type]
                self._check_op(op, t, v.span, lattr)  # type: ignore[arg-type]
                if op in ("in", "not_in"):
                    self.err("E320", f"`{op.replace('_', ' ')}` takes a list, and `request.{var}` is one value", right.span)
                return Atom(attr=lattr, cmp=op, operand=Var(name=var), origin=ref(v.span))  # type: ignore[arg-type]
            const = self.literal(right, t, op, lattr)  # type: ignore[arg-type]
            return Atom(attr=lattr, cmp=op, operand=const, origin=ref(v.span))  # type: ignore[arg-type]
        if isinstance(v, ast.Call):
            self.err("E404", f"`{v.func}(…)` is not allowed in `require`", v.span, "`has(…)` belongs in `when`")
        self.err("E318", f"a requirement must be true or false, found {shape(v)}", v.span)
        raise AssertionError

    def _unknown_attribute(self, n: ast.Name) -> None:
        if n.parts[0] == "request":
            self.err("E408", f"`require` constrains the instance; `{n.dotted}` is the request", n.span)
        choices = list(INSTANCE_ATTRIBUTES)
        self.err("E410", f"unknown instance attribute `{n.dotted}`", n.span,
                 did_you_mean(n.dotted, choices) or f"labels are written `{LABEL_PREFIX}KEY`")

    def _check_op(self, op: str, t: str, span, what: str) -> None:
        if op in ("<", "<=", ">", ">=") and t not in QUANTITY_TYPES:
            self.err("E321", f"`{op}` orders quantities, and `{what}` is {units.describe(t)}", span)

    # ------------------------------------------------------------------ literals
    def literal(self, v: ast.Value, t: str, op: str, what: str, var: str | None = None) -> Const:
        self._check_op(op, t, v.span, what)
        if op in ("in", "not_in"):
            if not isinstance(v, ast.ListValue):
                self.err("E320", f"`{op.replace('_', ' ')}` takes a list, found {shape(v)}", v.span)
            return Const(value=tuple(self.scalar(i, t, what, var) for i in v.items))
        if isinstance(v, ast.ListValue):
            self.err("E322", f"`{op}` compares one value; use `in` for a list", v.span)
        return Const(value=self.scalar(v, t, what, var))

    def scalar(self, v: ast.Value, t: str, what: str, var: str | None) -> bool | float | str:
        if t in QUANTITY_TYPES:
            if not isinstance(v, ast.Quantity) or v.of is not None:
                self.err("E301", f"`{what}` is {units.describe(t)}, found {shape(v)}", v.span)
            si = units.to_si(v.number, v.unit, t)
            if si is None:
                got = units.quantity_type(v.unit)
                self.err("E303", f"`{what}` is {units.describe(t)}, found {units.describe(got)}", v.span)
            return si
        if kind_of(t) is Kind.FLAG:
            if isinstance(v, ast.Name) and v.dotted in BOOL_WORDS:
                return BOOL_WORDS[v.dotted]
            self.err("E313", f"`{what}` is yes or no, found {shape(v)}", v.span)
        if kind_of(t) is Kind.TEXT:
            if isinstance(v, ast.String):
                return v.value
            if isinstance(v, ast.Name) and len(v.parts) == 1:
                return v.parts[0]
            self.err("E312", f"`{what}` is a string, found {shape(v)}", v.span)
        # names
        if isinstance(v, ast.String):
            return v.value
        if not isinstance(v, ast.Name) or len(v.parts) != 1:
            self.err("E309", f"`{what}` is a name, found {shape(v)}", v.span)
        word = v.parts[0]
        if var == "tenant_class" and word not in self.scope.tenant_classes:
            self.err("E411", f"no tenant has class `{word}`", v.span,
                     did_you_mean(word, self.scope.tenant_classes) or "declare tenants in a `tenants` block")
        allowed = self.scope.values.get(var or "", ())
        if allowed and word not in allowed:
            self.err("E310", f"`{word}` is not a declared value of `request.{var}`", v.span,
                     did_you_mean(word, allowed) or f"one of: {', '.join(allowed)}")
        return word
