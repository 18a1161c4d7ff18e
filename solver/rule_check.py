"""Request-rule analyses over the fleet's declared domains.

- E502: a rule no request can satisfy — its guard never holds for a declared request, or
  no declared instance meets its requirement when it applies. The unsat core names the
  conditions (each with its span) that conflict.
- W501: a rule shadowed by another — whenever it applies the other applies too, and the
  other's requirement implies its own, so it can never change a decision. Of two
  equivalent rules the later one is reported.
- W503: a rule that never rejects any declared instance when it applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from policyc.compiler.bundle import Atom, Bundle, RequestRule, Test
from policyc.compiler.diagnostic import Diagnostic, Note, error, warning

from policyc.compiler.attributes import attribute_type
from policyc.compiler.units import format_si

from .classes import InstanceClass, group
from .domains import domains
from .encode import RuleEncoder
from .space import Space
from .verdict import Verdict, new_solver, verdict



@dataclass(frozen=True, slots=True)
class RuleUnsat:
    rule: RequestRule
    guard_only: bool  # the guard alone is contradictory
    domain: bool  # the requirement conflicts with the declared instances, not with itself
    core: tuple[Atom | Test, ...]


class RuleAnalysis:
    """One encoding of a bundle's domains, reused by every rule query.

    The fleet is encoded as instance classes (`classes.py`): one disjunct per class of
    contracts, not per contract. Each kind of query has one solver holding the shared
    prefix (domains and the space's axioms); a query is a push, its own constraints, a
    check and a pop.
    """

    def __init__(self, bundle: Bundle, *, per_contract: bool = False) -> None:
        self.bundle = bundle
        self.space = Space()
        dom = domains(bundle)
        self.enc = RuleEncoder(self.space, dom)
        # per_contract: the encoding before instance classes, kept as the benchmark's baseline
        self.classes: tuple[InstanceClass, ...] = () if per_contract else group(bundle.contracts, dom)
        for c in self.classes:
            self.space.reserve(c.names)
        fleet = self.enc.fleet_domain((), bundle.contracts) if per_contract else self.enc.fleet_domain(self.classes)
        self.req_dom = self.enc.request_domain()
        self.inst_dom = z3.And(self.enc.instance_frame(), fleet)
        self._solvers: dict[tuple[bool, bool], z3.Solver] = {}

    def _solver(self, *, instance: bool, cores: bool = False) -> z3.Solver:
        """The solver holding the request domain and either the fleet or the frame."""
        s = self._solvers.get((instance, cores))
        if s is None:
            s = self._solvers[(instance, cores)] = new_solver()
            if cores:
                s.set("core.minimize", True)
            s.add(self.req_dom, self.inst_dom if instance else self.enc.instance_frame(), *self.space.axioms)
        return s

    def _check(self, s: z3.Solver, *constraints: z3.BoolRef) -> Verdict:
        s.push()
        try:
            s.add(*constraints)
            return verdict(s.check())
        finally:
            s.pop()

    def unsat_rule(self, rule: RequestRule) -> RuleUnsat | None | Verdict:
        """The conflict that makes the rule unsatisfiable; None when satisfiable; UNKNOWN."""
        # guard alone, then the requirement on its own (a contradiction in the rule's own
        # words, so the core shows both sides), then against the declared instances
        for guard_only, instance in ((True, False), (False, False), (False, True)):
            s = self._solver(instance=instance, cores=True)
            s.push()
            try:
                tracked: dict[int, tuple[z3.BoolRef, Atom | Test]] = {}

                def leaf(node: Atom | Test, f: z3.BoolRef) -> z3.BoolRef:
                    lit = z3.Bool(f"leaf{len(tracked)}")
                    x = z3.Bool(f"val{len(tracked)}")
                    s.add(z3.Implies(lit, x == f))
                    tracked[lit.get_id()] = (lit, node)
                    return x

                s.add(self.enc.applies(rule, leaf if guard_only else None))
                if not guard_only:
                    s.add(self.enc.require(rule, leaf))
                v = verdict(s.check(*[lit for lit, _ in tracked.values()]))
                core_ids = [c.get_id() for c in s.unsat_core()] if v is Verdict.UNSAT else []
            finally:
                s.pop()
            if v is Verdict.UNKNOWN:
                return v
            if v is Verdict.UNSAT:
                core = tuple(tracked[c][1] for c in core_ids)
                order = {id(n): i for i, (_, n) in enumerate(tracked.values())}
                return RuleUnsat(rule, guard_only, instance, tuple(sorted(core, key=lambda n: order[id(n)])))
        return None

    def subsumes(self, s_rule: RequestRule, r_rule: RequestRule) -> Verdict:
        """UNSAT means `s_rule` subsumes `r_rule` (r can never change a decision)."""
        e = self.enc
        return self._check(self._solver(instance=True), e.applies(r_rule),
                           z3.Or(z3.Not(e.applies(s_rule)), z3.And(e.require(s_rule), z3.Not(e.require(r_rule)))))

    def never_rejects(self, rule: RequestRule) -> Verdict:
        """UNSAT means no declared instance fails the rule when it applies."""
        return self._check(self._solver(instance=True), self.enc.applies(rule), z3.Not(self.enc.require(rule)))


def _describe(node: Atom | Test, a: RuleAnalysis | None = None) -> str:
    if isinstance(node, Test):
        if node.cmp is None:
            return f"`request.{node.var}` is present"
        vtype = None if a is None else a.enc.dom.vars[node.var].type
        return f"`request.{node.var} {node.cmp.replace('_', ' ')} {_value(node.operand.value, vtype)}`"  # type: ignore[union-attr]
    right = f"request.{node.operand.name}" if node.operand.kind == "var" else _value(node.operand.value, attribute_type(node.attr))
    return f"`{node.attr} {node.cmp.replace('_', ' ')} {right}`"


def _value(v, vtype: str | None) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_value(x, vtype) for x in v) + "]"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return format_si(v, vtype or "count")
    return str(v)


def check_rules(bundle: Bundle, *, per_contract: bool = False) -> list[Diagnostic]:
    if not bundle.rules:
        return []
    a = RuleAnalysis(bundle, per_contract=per_contract)
    diags: list[Diagnostic] = []
    dead: set[str] = set()
    for rule in bundle.rules:
        res = a.unsat_rule(rule)
        if res is Verdict.UNKNOWN:
            diags.append(warning("W502", f"could not decide whether rule `{rule.id}` is satisfiable (solver timeout)", rule.origin.span()))
            dead.add(rule.id)
        elif isinstance(res, RuleUnsat):
            dead.add(rule.id)
            what = ("its `when` condition holds for no declared request" if res.guard_only
                    else "no declared instance meets its requirement when it applies" if res.domain
                    else "its requirement contradicts itself")
            notes = [Note(n.origin.span(), f"conflicting condition {_describe(n, a)}") for n in res.core]
            if res.domain:
                notes.append(Note(None, "instances range over the bundle's contracts, GPU catalog and declared regions"))
            diags.append(error("E502", f"rule `{rule.id}` can never be satisfied: {what}", rule.origin.span(),
                               "remove the rule or relax the conflicting conditions", notes))
    live = [r for r in bundle.rules if r.id not in dead]
    index = {r.id: i for i, r in enumerate(bundle.rules)}
    for r in live:
        for s_rule in live:
            if s_rule.id == r.id or a.subsumes(s_rule, r) is not Verdict.UNSAT:
                continue
            if index[r.id] < index[s_rule.id] and a.subsumes(r, s_rule) is Verdict.UNSAT:
                continue  # equivalent: the later one is reported
            diags.append(warning("W501", f"rule `{r.id}` is shadowed by rule `{s_rule.id}`", r.origin.span(),
                                 "whenever it applies the other applies too and demands at least as much; remove one",
                                 [Note(s_rule.origin.span(), f"rule `{s_rule.id}` is declared here")]))
            break
        else:
            if a.never_rejects(r) is Verdict.UNSAT:
                diags.append(warning("W503", f"rule `{r.id}` never rejects a declared instance", r.origin.span(),
                                     "its requirement holds for every instance the contracts allow"))
    return diags
