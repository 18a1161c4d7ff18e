"""Runtime request feasibility: can any declared instance serve this request at all?

The decision service asks before any index scan. A request is infeasible when it falls
outside its headers' declared values or ranges, or when the requirements of the rules
that apply to it conflict with every instance the bundle's contracts allow (region
`mars-1`, an SLO below every contract's). The reason names the rules and their spans.

Answers are cached by request *shape*: variables whose value cannot change the answer
are merged (a quantity is reduced to its position among the thresholds it is compared
with; names, strings and flags are kept as they are), so a warm check is one key build
and one dict lookup — microseconds. A miss runs Z3 once (milliseconds) under a lock.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Mapping, Union

import z3

from policyc.compiler.bundle import Atom, Bundle, Scalar, SourceRef, Test
from policyc.compiler.meaning import CONTRACT_QUANTITIES, fixed_quantity

from .classes import group
from .domains import QUANTITY_TYPES, domains, leaves
from .encode import RuleEncoder
from policyc.compiler.semantics import rule_applies
from .space import Space
from .verdict import Verdict, new_solver, verdict

FIXED_ATTRS = CONTRACT_QUANTITIES  # one value per contract


@dataclass(frozen=True, slots=True)
class Feasible:
    feasible: bool = True


@dataclass(frozen=True, slots=True)
class Infeasible:
    reason: str
    rule_ids: tuple[str, ...] = ()
    spans: tuple[SourceRef, ...] = ()
    feasible: bool = False


@dataclass(frozen=True, slots=True)
class Undecided:
    """Z3 could not answer in time; the caller decides (never folded into yes or no)."""

    reason: str
    feasible: None = None


Answer = Union[Feasible, Infeasible, Undecided]
FEASIBLE = Feasible()
_ABSENT = object()


class RequestFeasibility:
    def __init__(self, bundle: Bundle, *, max_cache: int = 1 << 16) -> None:
        self.bundle = bundle
        self.dom = domains(bundle)
        self.space = Space()
        self.enc = RuleEncoder(self.space, self.dom)
        self.max_cache = max_cache
        self._cache: dict[tuple, Answer] = {}
        self._lock = threading.Lock()
        self._headers = {h.var: h for h in bundle.headers}
        self._vars = tuple(sorted(v for v in self.dom.vars))
        self._breaks = {v: self._breakpoints(v) for v in self._vars}
        self._solver = new_solver()
        self._solver.set("core.minimize", True)
        classes = group(bundle.contracts, self.dom)  # one disjunct per instance class, not per contract
        for c in classes:
            self.space.reserve(c.names)
        self._solver.add(self.enc.instance_frame(), self.enc.fleet_domain(classes), *self.space.axioms)
        self._rule_lits = {}
        for r in bundle.rules:
            lit = z3.Bool(f"rule:{r.id}")
            self._solver.add(z3.Implies(lit, self.enc.require(r)))
            self._rule_lits[r.id] = lit

    # ------------------------------------------------------------------ shapes
    def _breakpoints(self, var: str) -> tuple[float, ...] | None:
        """Thresholds a quantity variable is compared with, or None when exact values matter."""
        vd = self.dom.vars[var]
        if vd.type not in QUANTITY_TYPES:
            return None
        points: set[float] = set()
        if vd.range is not None:
            points.update((vd.range.lo, vd.range.hi))
        for r in self.bundle.rules:
            for leaf in (*leaves(r.guard), *leaves(r.require)):
                if isinstance(leaf, Test) and leaf.var == var and leaf.operand is not None:
                    v = leaf.operand.value
                    points.update(float(x) for x in (v if isinstance(v, tuple) else (v,)))
                elif isinstance(leaf, Atom) and leaf.operand.kind == "var" and leaf.operand.name == var:
                    if leaf.attr not in FIXED_ATTRS:
                        return None
                    for c in self.bundle.contracts:
                        points.add(fixed_quantity(c, leaf.attr))
        points.add(0.0)
        return tuple(sorted(points))

    def shape(self, variables: Mapping[str, Scalar]) -> tuple:
        """The cache key: equal keys are guaranteed equal answers."""
        key = []
        for v in self._vars:
            x = variables.get(v, _ABSENT)
            bp = self._breaks[v]
            if x is _ABSENT or bp is None or isinstance(x, (bool, str)):
                key.append(x if x is not _ABSENT else _ABSENT)
            else:
                i = bisect.bisect_left(bp, x)
                key.append(2 * i + (i < len(bp) and bp[i] == x))
        return tuple(key)

    # ------------------------------------------------------------------ checks
    def check(self, variables: Mapping[str, Scalar]) -> Answer:
        """Cached: the answer for this request's shape."""
        key = self.shape(variables)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        answer = self.solve(variables)
        if len(self._cache) >= self.max_cache:
            self._cache.clear()
        self._cache[key] = answer
        return answer

    def solve(self, variables: Mapping[str, Scalar]) -> Answer:
        """Uncached: validate against the declared request domain, then ask Z3."""
        req = dict(variables)
        if "tenant" in req and "tenant_class" not in req and req["tenant"] in self.dom.tenants:
            req["tenant_class"] = self.dom.tenants[str(req["tenant"])]
        bad = self._outside_domain(req)
        if bad is not None:
            return bad
        rules = [r for r in self.bundle.rules if rule_applies(r, req)]
        if not rules:
            return FEASIBLE if self.bundle.contracts else Infeasible("the bundle declares no contracts")
        with self._lock:
            s = self._solver
            s.push()
            try:
                for name in self._vars:
                    vd = self.dom.vars[name]
                    slot = self.space.var(name, vd.type)
                    if name in req:
                        s.add(slot.present, slot.value == self.space.const(slot.kind, req[name]))  # type: ignore[arg-type]
                    else:
                        s.add(z3.Not(slot.present))  # type: ignore[arg-type]
                v = verdict(s.check(*[self._rule_lits[r.id] for r in rules]))
                core = {str(c) for c in s.unsat_core()} if v is Verdict.UNSAT else set()
            finally:
                s.pop()
        if v is Verdict.SAT:
            return FEASIBLE
        if v is Verdict.UNKNOWN:
            return Undecided("the solver did not answer in time")
        blamed = tuple(r for r in rules if f"rule:{r.id}" in core)
        ids = tuple(r.id for r in blamed)
        listed = ", ".join(f"`{i}`" for i in ids)
        return Infeasible(f"no declared instance satisfies rule{'s' * (len(ids) != 1)} {listed} for this request",
                          ids, tuple(r.origin for r in blamed))

    def _outside_domain(self, req: dict[str, Scalar]) -> Infeasible | None:
        for name, vd in self.dom.vars.items():
            h = self._headers.get(name)
            spans = (h.origin,) if h else ()
            where = f"header `{h.header}`" if h else "policyc"
            if name not in req:
                if vd.always_present:
                    return Infeasible(f"the request has no `{name}`, which {where} requires", (), spans)
                continue
            x = req[name]
            if vd.type in QUANTITY_TYPES:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0:
                    return Infeasible(f"`request.{name}` must be a non-negative quantity", (), spans)
                if vd.range is not None and not (vd.range.lo <= x <= vd.range.hi):
                    return Infeasible(f"`request.{name}` is outside the range {where} declares", (), spans)
            elif vd.values is not None and x not in vd.values:
                return Infeasible(f"`{x}` is not a declared value of `request.{name}` (one of: {', '.join(vd.values)})", (), spans)
        return None
