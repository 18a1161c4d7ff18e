"""Contract feasibility in Z3, with the unsat core mapped to source spans (E501).

Quantities are reals in SI; the GPU the contract runs on is an integer index into the
catalog, so "some GPU class meets the bandwidth need and computes the worst-case request
within the SLO's compute budget" is one existential query. Every contract field is an
assumption literal: when the query is unsat, the (minimised) core is the set of fields that
conflict, each reported with its `file:line:col`.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from policyc.compiler.bundle import Contract, GpuClass
from policyc.compiler.diagnostic import Diagnostic, Note, error, warning

from .contract_clauses import Clause, ContractFacts, clause_origin, describe, facts
from .verdict import Verdict, new_solver, verdict


@dataclass(frozen=True, slots=True)
class ContractVerdict:
    verdict: Verdict
    core: tuple[Clause, ...] = ()


def _q(x) -> z3.ArithRef:
    return z3.RealVal(x)


def encode(f: ContractFacts) -> tuple[list[z3.BoolRef], dict[Clause, z3.BoolRef]]:
    """Structural constraints (always in force) and one formula per clause."""
    flo, fhi, eff, lat, allow, bw = z3.Reals("flo fhi eff lat allow bw")
    base: list[z3.BoolRef] = [flo >= 0, flo <= fhi, eff > 0, eff <= 1, allow >= 0, bw >= 0]
    clauses: dict[Clause, z3.BoolRef] = {
        Clause.FLOPS: z3.And(flo == _q(f.flops_lo), fhi == _q(f.flops_hi)),
        Clause.EFFICIENCY: eff == _q(f.efficiency),
        Clause.BANDWIDTH: bw == _q(f.bandwidth),
    }
    if f.latency is not None:
        base.append(lat - allow > 0)
        clauses[Clause.LATENCY] = lat == _q(f.latency)
        clauses[Clause.ALLOWANCE] = allow == _q(f.allowance)
    if f.gpus:
        g = z3.Int("gpu")
        base += [g >= 0, g < len(f.gpus)]
        peak = _q(0)
        hbm = _q(0)
        for i, gf in reversed(list(enumerate(f.gpus))):
            peak = z3.If(g == i, _q(gf.peak), peak)
            hbm = z3.If(g == i, _q(gf.hbm), hbm)
        base.append(bw <= hbm)
        if f.latency is not None:
            base.append(fhi <= peak * eff * (lat - allow))
        clauses[Clause.PRECISION] = z3.Or([g == i for i, gf in enumerate(f.gpus) if gf.offers_precision] or [z3.BoolVal(False)])
        if f.archs:
            clauses[Clause.ARCH] = z3.Or([g == i for i, gf in enumerate(f.gpus) if gf.arch in f.archs] or [z3.BoolVal(False)])
    return base, clauses


def encode_fixed(f: ContractFacts) -> z3.BoolRef:
    """Every clause in force, constants substituted: a linear query for the common case."""
    checks: list[z3.BoolRef] = [z3.BoolVal(f.flops_lo <= f.flops_hi)]
    budget = None
    if f.latency is not None:
        budget = f.latency - f.allowance
        checks.append(z3.BoolVal(budget > 0))
    if f.gpus:
        g = z3.Int("gpu")
        options = []
        for i, gf in enumerate(f.gpus):
            if not gf.offers_precision or (f.archs and gf.arch not in f.archs):
                continue
            need = [_q(f.bandwidth) <= _q(gf.hbm)]
            if budget is not None and budget > 0:
                need.append(_q(f.flops_hi) <= _q(gf.peak * f.efficiency) * _q(budget))
            options.append(z3.And(g == i, *need))
        checks.append(z3.Or(options) if options else z3.BoolVal(False))
    return z3.And(checks)


def check(f: ContractFacts, solver: z3.Solver | None = None) -> ContractVerdict:
    """Sat when the contract is feasible; otherwise the minimised core of its clauses.

    The all-clauses query is linear and answers most contracts; only an unsat (or unknown)
    answer pays for the nonlinear encoding with assumption literals that yields the core.
    """
    fast = solver or new_solver()
    fast.push()
    fast.add(encode_fixed(f))
    first = verdict(fast.check())
    fast.pop()
    if first is Verdict.SAT:
        return ContractVerdict(first)
    base, clauses = encode(f)
    s = new_solver()
    s.set("core.minimize", True)
    s.add(*base)
    lits = {}
    for clause, formula in clauses.items():
        lit = z3.Bool(f"clause:{clause.value}")
        s.add(z3.Implies(lit, formula))
        lits[lit.get_id()] = (lit, clause)
    v = verdict(s.check(*[lit for lit, _ in lits.values()]))
    if v is not Verdict.UNSAT:
        return ContractVerdict(v)
    core = tuple(sorted((lits[c.get_id()][1] for c in s.unsat_core()), key=lambda c: c.value))
    return ContractVerdict(v, core)



def _why(f: ContractFacts, core: tuple[Clause, ...]) -> str:
    c = set(core)
    if c == {Clause.FLOPS}:
        return f"its FLOPs interval is empty: the low end {float(f.flops_lo):.3g} exceeds the high end {float(f.flops_hi):.3g}"
    if Clause.LATENCY in c and Clause.ALLOWANCE in c and f.latency is not None and f.latency <= f.allowance:
        return "its network/queueing allowance leaves no time of the SLO for compute"
    if Clause.LATENCY in c:
        return "no GPU class it may use computes its worst-case request within the SLO's compute budget"
    if Clause.BANDWIDTH in c:
        return f"it needs {float(f.bandwidth) / 1e9:g} GB/s of memory bandwidth, more than any GPU class it may use offers"
    if Clause.PRECISION in c:
        return f"no GPU class it may use offers precision `{f.precision}`"
    return "its clauses conflict"


def _help(f: ContractFacts, core: tuple[Clause, ...]) -> str | None:
    usable = [g for g in f.gpus
              if (Clause.ARCH not in core or not f.archs or g.arch in f.archs)
              and (Clause.PRECISION not in core or g.offers_precision)]
    if Clause.LATENCY in core and usable and f.latency is not None and f.latency > f.allowance:
        best = max(usable, key=lambda g: g.peak)
        fastest = f.flops_hi / (best.peak * f.efficiency)
        return (f"the fastest usable class, {best.name}, needs {float(fastest) * 1e3:.1f} ms for "
                f"{float(f.flops_hi):.3g} FLOPs at {float(f.efficiency):.0%} efficiency; "
                f"the compute budget is {float(f.latency - f.allowance) * 1e3:g} ms")
    if Clause.BANDWIDTH in core and usable:
        best = max(usable, key=lambda g: g.hbm)
        return f"the most a usable class offers is {float(best.hbm) / 1e9:g} GB/s ({best.name})"
    return None


def check_contract(contract: Contract, catalog: tuple[GpuClass, ...], solver: z3.Solver | None = None) -> list[Diagnostic]:
    """E501 when the contract is infeasible; a warning (W502) when Z3 cannot decide.
    `solver`: one to reuse (push/pop) across a fleet's contracts."""
    f = facts(contract, catalog)
    result = check(f, solver)
    if result.verdict is Verdict.SAT:
        return []
    where = contract.origin.span()
    if result.verdict is Verdict.UNKNOWN:
        return [warning("W502", f"could not decide whether contract `{contract.name}` is feasible (solver timeout)", where)]
    notes = [Note(clause_origin(contract, c).span(), describe(contract, c, f)) for c in result.core]
    return [error("E501", f"contract `{contract.name}` is infeasible: {_why(f, result.core)}", where,
                  _help(f, result.core), notes)]
