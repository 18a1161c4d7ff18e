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
attribute value, exclude requests OLD serves on that instance and ask again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import z3

from policyc.compiler.bundle import SECURITY_ATTRS, Bundle, RequestRule, Scalar, SourceRef

from .domains import Domains, domains
from .encode import RuleEncoder
from .semantics import applies, holds, instance_in_domain, request_in_domain
from .space import Space
from .verdict import Verdict, new_solver, verdict

COMPLIANCE_ROUNDS = 40


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


class _Side:
    def __init__(self, space: Space, bundle: Bundle) -> None:
        self.bundle = bundle
        self.dom: Domains = domains(bundle)
        self.enc = RuleEncoder(space, self.dom)
        self.req_dom = self.enc.request_domain()
        self.inst_dom = self.enc.instance_domain(bundle)
        self.fails = {r.id: z3.And(self.enc.applies(r), z3.Not(self.enc.require(r))) for r in bundle.rules}
        self.admits = z3.And(self.req_dom, self.inst_dom, *[z3.Not(f) for f in self.fails.values()])

    def rejecting(self, req: dict, attrs: dict) -> tuple[RequestRule, ...]:
        return tuple(r for r in self.bundle.rules if applies(r, req) and not holds(r.require, req, attrs))

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
    def __init__(self, old: Bundle, new: Bundle) -> None:
        self.space = Space()
        self.old = _Side(self.space, old)
        self.new = _Side(self.space, new)

    def _fix_request(self, s: z3.Solver, req: dict) -> None:
        for key, slot in self.space.request.items():
            name = key.rsplit(":", 1)[0]
            if name in req:
                s.add(slot.present, slot.value == self.space.const(slot.kind, req[name]))  # type: ignore[arg-type]
            else:
                s.add(z3.Not(slot.present))  # type: ignore[arg-type]

    def _fix_instance(self, formula: z3.BoolRef, model: z3.ModelRef) -> z3.BoolRef:
        """`formula` with the instance variables replaced by their values in `model`."""
        pairs = []
        for slot in self.space.instance.values():
            for term in (slot.value, slot.present, slot.infinite):
                if term is not None:
                    pairs.append((term, model.eval(term, model_completion=True)))
        return z3.substitute(formula, *pairs)

    def _difference(self, model: z3.ModelRef, direction: Direction, compliance: tuple[str, ...] = ()) -> Difference:
        req, attrs = self.space.witness(model)
        req = _req_view(req, self.old, self.new)
        refs = lambda rules: tuple(RuleRef(r.id, r.origin) for r in rules)  # noqa: E731
        domain = self.old.domain_problems(req, attrs, "OLD") + self.new.domain_problems(req, attrs, "NEW")
        return Difference(direction, req, attrs, refs(self.old.rejecting(req, attrs)), refs(self.new.rejecting(req, attrs)),
                          tuple(domain), compliance)

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
        for label, cond in targets:
            outer = new_solver()
            outer.add(self.new.admits, z3.Not(self.old.admits), cond)
            for _ in range(COMPLIANCE_ROUNDS):
                v = verdict(outer.check())
                if v is Verdict.UNSAT:
                    break
                if v is Verdict.UNKNOWN:
                    undecided.append(f"compliance of `{label}` (solver timeout)")
                    break
                m = outer.model()
                req, _ = self.space.witness(m)
                inner = new_solver()
                inner.add(self.old.admits, cond)
                self._fix_request(inner, req)
                iv = verdict(inner.check())
                if iv is Verdict.UNSAT:
                    found.append(self._difference(m, Direction.WIDENED, (label.split("=")[0],)))
                    break
                if iv is Verdict.UNKNOWN:
                    undecided.append(f"compliance of `{label}` (solver timeout)")
                    break
                outer.add(z3.Not(self._fix_instance(self.old.admits, inner.model())))
            else:
                undecided.append(f"compliance of `{label}` (no answer in {COMPLIANCE_ROUNDS} rounds)")
        return found, undecided

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
        s = new_solver()
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


def diff_bundles(old: Bundle, new: Bundle, *, limit: int = 20) -> DiffReport:
    """The public entry: every distinct difference (up to `limit`) with its witness."""
    return Differ(old, new).diff(limit)
