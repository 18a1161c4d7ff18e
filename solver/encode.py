"""Request rules, request domains and instance domains as Z3 formulas over a `Space`.

The encoding mirrors `semantics.py` clause by clause (that module is the reference the
tests replay witnesses through). `leaf` lets a caller replace each Atom/Test by a tracked
literal, so an unsat core names the conditions (with their spans) that conflict.
"""

from __future__ import annotations

from typing import Callable

import z3

from policyc.compiler.bundle import And, Atom, Contract, Expr, Not, Or, RequestRule, Test
from policyc.compiler.meaning import fixed_attributes, fixed_quantity

from .classes import InstanceClass
from .domains import QUANTITY_TYPES, SESSION_STATES, Domains, contract_regions, reads, usable_gpus
from .space import Slot, Space, real

Leaf = Callable[[Atom | Test, z3.BoolRef], z3.BoolRef]


def _cmp(cmp: str, left: z3.ExprRef, right: z3.ExprRef) -> z3.BoolRef:
    return {"==": lambda: left == right, "!=": lambda: left != right, "<": lambda: left < right,
            "<=": lambda: left <= right, ">": lambda: left > right, ">=": lambda: left >= right}[cmp]()


def compare(space: Space, slot: Slot, cmp: str, right: z3.ExprRef | tuple[z3.ExprRef, ...]) -> z3.BoolRef:
    """`slot cmp right`, with absent labels and an infinite SLO handled as in semantics."""
    if cmp in ("in", "not_in"):
        inside = z3.Or([slot.value == r for r in right]) if right else z3.BoolVal(False, space.ctx)
        body = inside if cmp == "in" else z3.Not(inside)
    else:
        body = _cmp(cmp, slot.value, right)
    if slot.infinite is not None:  # inf compares greater than every real
        body = z3.If(slot.infinite, z3.BoolVal(cmp in ("!=", ">", ">="), space.ctx), body)
    if slot.present is not None:
        body = z3.And(slot.present, body) if cmp not in ("!=", "not_in") else z3.Or(z3.Not(slot.present), body)
    return body


class RuleEncoder:
    def __init__(self, space: Space, dom: Domains) -> None:
        self.space = space
        self.dom = dom

    def _req_slot(self, var: str) -> Slot:
        return self.space.var(var, self.dom.vars[var].type)

    def leaf_formula(self, e: Atom | Test) -> z3.BoolRef:
        sp = self.space
        if isinstance(e, Test):
            slot = self._req_slot(e.var)
            if e.cmp is None:
                return slot.present
            v = e.operand.value  # type: ignore[union-attr]
            right = tuple(sp.const(slot.kind, x) for x in v) if isinstance(v, tuple) else sp.const(slot.kind, v)
            return compare(sp, Slot(slot.kind, slot.value), e.cmp, right)
        slot = sp.attr(e.attr)
        if e.operand.kind == "var":
            right = self._req_slot(e.operand.name).value
        else:
            v = e.operand.value
            right = tuple(sp.const(slot.kind, x) for x in v) if isinstance(v, tuple) else sp.const(slot.kind, v)
        return compare(sp, slot, e.cmp, right)

    def expr(self, e: Expr, leaf: Leaf | None = None) -> z3.BoolRef:
        match e:
            case And(args=args):
                return z3.And([self.expr(a, leaf) for a in args])
            case Or(args=args):
                return z3.Or([self.expr(a, leaf) for a in args])
            case Not(arg=arg):
                return z3.Not(self.expr(arg, leaf))
            case Atom() | Test():
                f = self.leaf_formula(e)
                return leaf(e, f) if leaf else f

    def applies(self, rule: RequestRule, leaf: Leaf | None = None) -> z3.BoolRef:
        parts = [self._req_slot(v).present for v in sorted(reads(rule))]
        if rule.guard is not None:
            parts.append(self.expr(rule.guard, leaf))
        return z3.And(parts) if parts else z3.BoolVal(True, self.space.ctx)

    def require(self, rule: RequestRule, leaf: Leaf | None = None) -> z3.BoolRef:
        return self.expr(rule.require, leaf)

    # ------------------------------------------------------------------ domains
    def request_domain(self) -> z3.BoolRef:
        sp, dom = self.space, self.dom
        out: list[z3.BoolRef] = []
        for name, vd in sorted(dom.vars.items()):
            if name == "tenant_class":
                continue
            slot = sp.var(name, vd.type)
            if vd.always_present:
                out.append(slot.present)
            cond: list[z3.BoolRef] = []
            if vd.type in QUANTITY_TYPES:
                cond.append(slot.value >= 0)
                if vd.range is not None:
                    cond += [slot.value >= real(vd.range.lo, sp.ctx), slot.value <= real(vd.range.hi, sp.ctx)]
            elif vd.values is not None:
                cond.append(z3.Or([slot.value == sp.code(v) for v in vd.values]))
            if cond:
                out.append(z3.Implies(slot.present, z3.And(cond)))
        tenant = sp.var("tenant", dom.vars["tenant"].type)
        tclass = sp.var("tenant_class", "name")
        known = [tenant.value == sp.code(t) for t in sorted(dom.tenants)]
        out.append(tclass.present == z3.And(tenant.present, z3.Or(known) if known else z3.BoolVal(False, sp.ctx)))
        for t, cls in sorted(dom.tenants.items()):
            out.append(z3.Implies(z3.And(tenant.present, tenant.value == sp.code(t)), tclass.value == sp.code(cls)))
        return z3.And(out)

    def contract_domain(self, c: Contract) -> z3.BoolRef:
        sp, dom = self.space, self.dom
        a = sp.attr
        fixed = fixed_attributes(c)
        out: list[z3.BoolRef] = [a(k).value == sp.code(str(fixed[k])) for k in ("model", "version")]
        out += [a(k).value == real(fixed_quantity(c, k), sp.ctx) for k in ("flops_min", "flops_max", "bandwidth")]
        slo = a("slo_latency")
        out.append(z3.And(z3.Not(slo.infinite), slo.value == real(c.slo.latency, sp.ctx)) if c.slo else slo.infinite)
        regions = contract_regions(c, dom)
        if regions is not None:
            out.append(z3.Or([a("region").value == sp.code(r) for r in regions]))
        if dom.gpus:
            gm, ga = a("gpu_model").value, a("gpu_arch").value
            out.append(z3.Or([z3.And(gm == sp.code(g), ga == sp.code(dom.gpus[g][0])) for g in usable_gpus(c, dom)]
                             or [z3.BoolVal(False, sp.ctx)]))
        elif c.gpu_arch:
            out.append(z3.Or([a("gpu_arch").value == sp.code(x) for x in c.gpu_arch]))
        for s in c.security:
            out.append(a(s).value)
        if c.session is not None and c.session.state != "remote":
            out.append(a("session_state").value == sp.code(c.session.state))
        labels = dict(c.labels)
        for k in dom.label_keys:
            if k in labels:
                ls = a("labels." + k)
                out.append(z3.And(ls.present, ls.value == sp.code(labels[k])))
        return z3.And(out)

    def instance_frame(self) -> z3.BoolRef:
        """What holds of every instance whatever its contract."""
        sp = self.space
        numa = sp.attr("numa_node").value
        state = sp.attr("session_state").value
        return z3.And(numa >= 0, z3.IsInt(numa), z3.Or([state == sp.code(s) for s in SESSION_STATES]))

    def name_in(self, term: z3.ExprRef, names: tuple[str, ...]) -> z3.BoolRef:
        """`term` is one of `names`: runs of consecutive codes become one range test, so a
        class interned in one go (`Space.reserve`) costs two comparisons, not one per member."""
        codes = sorted({self.space.code(n) for n in names})
        runs: list[list[int]] = []
        for c in codes:
            if runs and runs[-1][1] == c - 1:
                runs[-1][1] = c
            else:
                runs.append([c, c])
        parts = [term == lo if lo == hi else z3.And(term >= lo, term <= hi) for lo, hi in runs]
        return z3.Or(parts) if len(parts) != 1 else parts[0]

    def class_domain(self, cls: InstanceClass) -> z3.BoolRef:
        """Exactly the instances of the class's members (see `classes.py`): the model is one
        of the member names, each contract-fixed attribute a function of the model whose
        values are recorded as axioms in the space."""
        sp, k = self.space, cls.key
        a = sp.attr
        model = a("model").value
        out: list[z3.BoolRef] = [self.name_in(model, cls.names)]
        for c in cls.members:
            fixed = fixed_attributes(c)
            for attr in ("version", "flops_min", "flops_max", "bandwidth"):
                sp.fact(attr, c.name, fixed[attr])
            if c.slo is not None:
                sp.fact("slo_latency", c.name, fixed["slo_latency"])
        for attr in ("version", "flops_min", "flops_max", "bandwidth"):
            out.append(a(attr).value == sp.of(attr)(model))
        slo = a("slo_latency")
        out.append(z3.And(z3.Not(slo.infinite), slo.value == sp.of("slo_latency")(model)) if k.has_slo
                   else slo.infinite)
        # implied by the members' facts, stated so the solver can discard a whole class
        # (an SLO below every member's) without trying its members one by one
        for attr in ("flops_min", "flops_max", "bandwidth") + (("slo_latency",) if k.has_slo else ()):
            values = [fixed_quantity(c, attr) for c in cls.members]
            out += [a(attr).value >= real(min(values), sp.ctx), a(attr).value <= real(max(values), sp.ctx)]
        if k.regions is not None:
            out.append(z3.Or([a("region").value == sp.code(r) for r in k.regions]))
        if k.gpus is not None:
            gm, ga = a("gpu_model").value, a("gpu_arch").value
            out.append(z3.Or([z3.And(gm == sp.code(g), ga == sp.code(self.dom.gpus[g][0])) for g in k.gpus]))
        if k.archs is not None:
            out.append(z3.Or([a("gpu_arch").value == sp.code(x) for x in k.archs]))
        for s in k.security:
            out.append(a(s).value)
        if k.session is not None:
            out.append(a("session_state").value == sp.code(k.session))
        for key, value in k.labels:
            if value is not None:
                ls = a("labels." + key)
                out.append(z3.And(ls.present, ls.value == sp.code(value)))
        return z3.And(out)

    def fleet_domain(self, classes: tuple[InstanceClass, ...], exact: tuple[Contract, ...] = ()) -> z3.BoolRef:
        """Some class's instance or some `exact` contract's instance (frame not included);
        the space's axioms must hold wherever this is used."""
        parts = [self.class_domain(c) for c in classes] + [self.contract_domain(c) for c in exact]
        return z3.Or(parts) if parts else z3.BoolVal(False, self.space.ctx)
