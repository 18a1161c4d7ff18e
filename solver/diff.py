"""Semantic diff of two bundles: concrete requests whose outcome differs.

Both bundles are encoded over one `Space`, so "OLD admits this request on this instance
and NEW does not" (or the reverse) is one Z3 query whose model is a witness: a request
(its variables) and an instance class (its attributes). Each witness is replayed through
the reference semantics to name the rules responsible; the next query blocks that
pattern (direction, rules that reject on each side, domain membership), so the list has
one entry per distinct reason, up to `limit`.

Compliance widening — NEW lets a request be served on an instance with a security flag
off, or in a region, where OLD served that request on no such instance at all — is
decided per attribute value with a counterexample-guided loop: find a request NEW serves
there and OLD does not on that instance; if OLD serves it elsewhere with the same
attribute value, exclude every request OLD serves on that deployment (whichever OLD
contract runs there) and ask again.

Scale: contracts identical on both sides are encoded once, as instance classes
(`classes.py`), so a fleet of 1,000 contracts is a few hundred disjuncts shared by both
sides; only contracts that differ are encoded one by one. The compliance loop reuses one
solver for OLD's side (push/pop per request) and one per direction for the candidates.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

import z3

from policyc.compiler.bundle import SECURITY_ATTRS, Bundle, Contract, RequestRule, Scalar, SourceRef
from policyc.compiler.meaning import CONTRACT_ATTRIBUTES, fixed_attributes

from .classes import InstanceClass, group
from .domains import Domains, domains
from .encode import RuleEncoder
from policyc.compiler.semantics import require_holds, rule_applies

from .semantics import contract_admits, instance_in_domain, request_in_domain
from .space import Space
from .verdict import Verdict, new_solver, verdict

COMPLIANCE_ROUNDS = 40
_FIXED = frozenset(CONTRACT_ATTRIBUTES)


class Direction(enum.Enum):
    WIDENED = "widened"  # NEW admits, OLD does not
    NARROWED = "narrowed"  # OLD admits, NEW does not


@dataclass(frozen=True)
class RuleRef:
    id: str
    origin: SourceRef


@dataclass(frozen=True)
class Difference:
    direction: Direction
    request: dict[str, Scalar]
    instance: dict[str, Scalar]
    old_rejects: tuple[RuleRef, ...]  # OLD rules that reject this pair
    new_rejects: tuple[RuleRef, ...]
    domain: tuple[str, ...] = ()  # why one side's domains exclude the pair
    compliance: tuple[str, ...] = ()  # attributes whose protection is widened


@dataclass(frozen=True)
class DiffReport:
    differences: tuple[Difference, ...]
    truncated: bool = False
    undecided: tuple[str, ...] = field(default=())

    @property
    def widens_compliance(self) -> bool:
        return any(d.compliance for d in self.differences)

    @property
    def exit_code(self) -> int:
        """0 equivalent, 3 compliance widened, 4 other differences, 5 undecided."""
        if self.widens_compliance:
            return 3
        if self.differences:
            return 4
        return 5 if self.undecided else 0


def _domain_fields(c: Contract) -> tuple:
    """What a contract contributes to the instance domain (not where it was written)."""
    return (c.version, c.compute.request_flops(), c.memory.bandwidth_min, c.slo.latency if c.slo else None,
            c.regions, c.gpu_arch, tuple(sorted(set(c.security))), c.session.state if c.session else None, c.labels)


def _shared(old: Bundle, new: Bundle, d_old: Domains, d_new: Domains) -> tuple[Contract, ...]:
    """Contracts whose instances are the same on both sides: encoded once, as classes."""
    if (d_old.regions, d_old.gpus, d_old.label_keys) != (d_new.regions, d_new.gpus, d_new.label_keys):
        return ()
    theirs = {c.name: c for c in new.contracts}
    names = [c.name for c in old.contracts]
    if len(set(names)) != len(names) or len(theirs) != len(new.contracts):
        return ()
    return tuple(c for c in old.contracts if c.name in theirs and _domain_fields(c) == _domain_fields(theirs[c.name]))


class _Side:
    def __init__(self, space: Space, bundle: Bundle, dom: Domains, shared_dom: z3.BoolRef, shared: frozenset[str]) -> None:
        self.bundle = bundle
        self.dom = dom
        self.enc = RuleEncoder(space, self.dom)
        self.req_dom = self.enc.request_domain()
        own = tuple(c for c in bundle.contracts if c.name not in shared)
        self.inst_dom = z3.And(self.enc.instance_frame(), z3.Or(shared_dom, self.enc.fleet_domain((), own)))
        self.fails = {r.id: z3.And(self.enc.applies(r), z3.Not(self.enc.require(r))) for r in bundle.rules}
        self.admits = z3.And(self.req_dom, self.inst_dom, *[z3.Not(f) for f in self.fails.values()])
        self.serves = z3.And(self.req_dom, *[z3.Not(f) for f in self.fails.values()])  # on an instance known in domain

    def rejecting(self, req: dict, attrs: dict) -> tuple[RequestRule, ...]:
        return tuple(r for r in self.bundle.rules if rule_applies(r, req) and not require_holds(r.require, attrs, req))

    def domain_problems(self, req: dict, attrs: dict, label: str) -> list[str]:
        out = []
        if not request_in_domain(self.dom, req):
            out.append(f"the request is outside {label}'s declared headers")
        if not instance_in_domain(self.bundle, self.dom, attrs):
            c = self.bundle.contract(str(attrs.get("model")))
            out.append(f"no {label} contract allows this instance" if c is None
                       else f"{label} contract `{c.name}` ({c.origin}) does not allow this instance")
        return out


def _req_view(req: dict, a: _Side, b: _Side) -> dict:
    names = set(a.dom.vars) | set(b.dom.vars)
    return {k: v for k, v in req.items() if k in names}


class Differ:
    """Both bundles over one space. Contracts whose instances are the same on both sides
    are grouped into instance classes (`classes.py`) and encoded once, exactly; the rest,
    one disjunct each. Every solver gets the space's axioms (`_solver`)."""

    def __init__(self, old: Bundle, new: Bundle, *, use_classes: bool = True) -> None:
        self.space = Space()
        d_old, d_new = domains(old), domains(new)
        shared = _shared(old, new, d_old, d_new) if use_classes else ()
        self.classes: tuple[InstanceClass, ...] = group(shared, d_old)
        for c in self.classes:
            self.space.reserve(c.names)
        names = frozenset(c.name for c in shared)
        shared_dom = RuleEncoder(self.space, d_old).fleet_domain(self.classes)
        self.old = _Side(self.space, old, d_old, shared_dom, names)
        self.new = _Side(self.space, new, d_new, shared_dom, names)
        self._inner: z3.Solver | None = None
        self._fixed_cache: dict[str, list[tuple[z3.ExprRef, z3.ExprRef]]] = {}

    def _solver(self) -> z3.Solver:
        s = new_solver()
        s.add(*self.space.axioms)
        return s

    def _fix_request(self, s: z3.Solver, req: dict) -> None:
        for key, slot in self.space.request.items():
            name = key.rsplit(":", 1)[0]
            if name in req:
                s.add(slot.present, slot.value == self.space.const(slot.kind, req[name]))
            else:
                s.add(z3.Not(slot.present))

    def _difference(self, model: z3.ModelRef, direction: Direction, compliance: tuple[str, ...] = ()) -> Difference:
        req, attrs = self.space.witness(model)
        req = _req_view(req, self.old, self.new)
        refs = lambda rules: tuple(RuleRef(r.id, r.origin) for r in rules)  # noqa: E731
        domain = self.old.domain_problems(req, attrs, "OLD") + self.new.domain_problems(req, attrs, "NEW")
        return Difference(direction, req, attrs, refs(self.old.rejecting(req, attrs)), refs(self.new.rejecting(req, attrs)),
                          tuple(domain), compliance)

    def _old_serves_on(self, req: dict, cond: z3.BoolRef) -> Verdict | dict:
        """Whether OLD serves this one request on some instance meeting `cond`: the
        attributes of such an instance, UNSAT or UNKNOWN. One solver holds OLD's meaning
        for every call; the request and `cond` are pushed and popped."""
        if self._inner is None:
            self._inner = self._solver()
            self._inner.add(self.old.admits)
        s = self._inner
        s.push()
        try:
            s.add(cond)
            self._fix_request(s, req)
            v = verdict(s.check())
            attrs = self.space.witness(s.model())[1] if v is Verdict.SAT else None
        finally:
            s.pop()
        return attrs if attrs is not None else v

    def _fixed_pairs(self, c: Contract) -> list[tuple[z3.ExprRef, z3.ExprRef]]:
        """The contract-fixed instance attributes of `c`, as substitution pairs (cached)."""
        pairs = self._fixed_cache.get(c.name)
        if pairs is None:
            values = fixed_attributes(c)
            pairs = []
            for name, v in values.items():
                slot = self.space.instance.get(name)
                if slot is None:
                    continue
                if slot.infinite is not None:
                    pairs.append((slot.infinite, z3.BoolVal(math.isinf(v))))  # type: ignore[arg-type]
                    if math.isinf(v):  # type: ignore[arg-type]
                        continue
                pairs.append((slot.value, self.space.const(slot.kind, v)))
            self._fixed_cache[c.name] = pairs
        return pairs

    def _served_elsewhere(self, attrs: dict) -> z3.BoolRef:
        """Requests OLD serves on an instance with these deployment facts, whichever OLD
        contract it runs: every such request is served with the same attribute values, so
        none of them can widen compliance there. Which contracts allow the deployment is
        checked with the reference semantics; their fixed attributes are substituted."""
        side = self.old
        deploy = self._attr_pairs({k: v for k, v in attrs.items() if k not in _FIXED}, skip=_FIXED)
        served = z3.simplify(z3.substitute(side.serves, *deploy))
        allowed: list[Contract] = []
        for c in side.bundle.contracts:
            inst = {**attrs, **fixed_attributes(c)}
            if contract_admits(c, side.dom, inst):
                allowed.append(c)
        if not allowed:
            return z3.BoolVal(False)
        # conjuncts that no contract-fixed attribute occurs in are common to every disjunct
        parts = served.children() if z3.is_and(served) else [served]
        probe = self._fixed_pairs(allowed[0])
        common = [p for p in parts if z3.substitute(p, *probe).eq(p)]
        varying = z3.And([p for p in parts if not z3.substitute(p, *probe).eq(p)])
        out = [z3.simplify(z3.substitute(varying, *self._fixed_pairs(c))) for c in allowed]
        return z3.And(*common, z3.Or(out))

    def _attr_pairs(self, attrs: dict, skip: frozenset[str] = frozenset()) -> list[tuple[z3.ExprRef, z3.ExprRef]]:
        pairs: list[tuple[z3.ExprRef, z3.ExprRef]] = []
        for name, slot in self.space.instance.items():
            if name in skip:
                continue
            v = attrs.get(name)
            if slot.present is not None:
                pairs.append((slot.present, z3.BoolVal(v is not None)))
            if slot.infinite is not None:
                pairs.append((slot.infinite, z3.BoolVal(isinstance(v, float) and math.isinf(v))))
                if isinstance(v, float) and math.isinf(v):
                    continue
            if v is not None:
                pairs.append((slot.value, self.space.const(slot.kind, v)))
        return pairs

    def compliance(self) -> tuple[list[Difference], list[str]]:
        found: list[Difference] = []
        undecided: list[str] = []
        targets: list[tuple[str, z3.BoolRef]] = []
        for s_attr in SECURITY_ATTRS:
            if s_attr in self.space.instance:
                targets.append((s_attr, z3.Not(self.space.instance[s_attr].value)))
        if "region" in self.space.instance:
            regions = sorted(set(self.old.dom.regions or ()) | set(self.new.dom.regions or ()))
            region = self.space.instance["region"].value
            for r in regions:
                targets.append((f"region={r}", region == self.space.code(r)))
        outer = self._solver()
        outer.add(self.new.admits, z3.Not(self.old.admits))
        for label, cond in targets:
            outer.push()
            outer.add(cond)
            self._widening(outer, label, cond, found, undecided)
            outer.pop()
        return found, undecided

    def _widening(self, outer: z3.Solver, label: str, cond: z3.BoolRef, found: list[Difference], undecided: list[str]) -> None:
        """The counterexample-guided loop for one attribute value (see the module docstring)."""
        for _ in range(COMPLIANCE_ROUNDS):
            v = verdict(outer.check())
            if v is Verdict.UNSAT:
                break
            if v is Verdict.UNKNOWN:
                undecided.append(f"compliance of `{label}` (solver timeout)")
                break
            m = outer.model()
            req, _ = self.space.witness(m)
            served = self._old_serves_on(req, cond)
            if served is Verdict.UNSAT:
                found.append(self._difference(m, Direction.WIDENED, (label.split("=")[0],)))
                break
            if served is Verdict.UNKNOWN:
                undecided.append(f"compliance of `{label}` (solver timeout)")
                break
            outer.add(z3.Not(self._served_elsewhere(served)))  # type: ignore[arg-type]
        else:
            undecided.append(f"compliance of `{label}` (no answer in {COMPLIANCE_ROUNDS} rounds)")

    def _pattern(self, d: Difference, model: z3.ModelRef) -> z3.BoolRef:
        """The formula true of every witness with the same reasons as `d`."""
        old_ids = {r.id for r in d.old_rejects}
        new_ids = {r.id for r in d.new_rejects}
        parts = [z3.Not(self.old.admits) if d.direction is Direction.WIDENED else z3.Not(self.new.admits)]
        parts += [f if rid in old_ids else z3.Not(f) for rid, f in self.old.fails.items()]
        parts += [f if rid in new_ids else z3.Not(f) for rid, f in self.new.fails.items()]
        for side in (self.old, self.new):
            parts.append(side.req_dom if z3.is_true(model.eval(side.req_dom, model_completion=True)) else z3.Not(side.req_dom))
            in_dom = z3.is_true(model.eval(side.inst_dom, model_completion=True))
            parts.append(side.inst_dom if in_dom else z3.Not(side.inst_dom))
        if d.domain and "model" in self.space.instance:
            m = self.space.instance["model"].value
            parts.append(m == model.eval(m, model_completion=True))
        return z3.And(parts)

    def diff(self, limit: int = 20) -> DiffReport:
        found, undecided = self.compliance()
        s = self._solver()
        s.add(self.old.admits != self.new.admits)
        truncated = False
        for _ in range(4 * limit + 8):  # each round blocks one pattern; bounded whatever happens
            v = verdict(s.check())
            if v is Verdict.UNSAT:
                break
            if v is Verdict.UNKNOWN:
                undecided.append("further differences (solver timeout)")
                break
            if len(found) >= limit:
                truncated = True
                break
            m = s.model()
            direction = Direction.WIDENED if z3.is_true(m.eval(self.new.admits, model_completion=True)) else Direction.NARROWED
            d = self._difference(m, direction)
            s.add(z3.Not(self._pattern(d, m)))
            if not any(_same(d, f) for f in found):
                found.append(d)
        else:
            truncated = True
        return DiffReport(tuple(found), truncated, tuple(undecided))


def _same(a: Difference, b: Difference) -> bool:
    return (a.direction, a.old_rejects, a.new_rejects, a.domain) == (b.direction, b.old_rejects, b.new_rejects, b.domain)


def diff_bundles(old: Bundle, new: Bundle, *, limit: int = 20, use_classes: bool = True) -> DiffReport:
    """The public entry: every distinct difference (up to `limit`) with its witness.
    `use_classes=False` encodes every contract on its own (the benchmark's baseline)."""
    return Differ(old, new, use_classes=use_classes).diff(limit)
