"""A contract as named clauses: the unit an unsat core is made of.

Each clause is one field of the contract (`compute.flops`, `slo.latency`, …) and carries
that field's `file:line:col`, so a core reads as a list of source lines. The same clause
list drives both the Z3 encoding (`contract_check.py`) and the brute-force reference
(`contract_reference.py`) that the property tests compare it with; relaxing a clause
means dropping it, and what remains must still be infeasible for a core to be honest.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction

from policyc.compiler.bundle import Contract, GpuClass, SourceRef


class Clause(enum.Enum):
    """The contract fields that can take part in a conflict (value: the field path)."""

    FLOPS = "compute.flops"
    EFFICIENCY = "compute.efficiency"
    PRECISION = "compute.precision"
    BANDWIDTH = "memory.bandwidth"
    LATENCY = "slo.latency"
    ALLOWANCE = "slo.allowance"
    ARCH = "placement.gpu_arch"


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One catalog class in exact arithmetic: the peak for the contract's precision (or its
    best peak when the precision clause is relaxed) and HBM bandwidth."""

    name: str
    arch: str
    peak: Fraction
    offers_precision: bool
    hbm: Fraction


@dataclass(frozen=True, slots=True)
class ContractFacts:
    """The numbers of one contract, exact, and which clauses it actually states."""

    name: str
    flops_lo: Fraction
    flops_hi: Fraction
    efficiency: Fraction
    bandwidth: Fraction
    latency: Fraction | None
    allowance: Fraction
    archs: tuple[str, ...]
    precision: str
    gpus: tuple[GpuFacts, ...]

    def clauses(self) -> tuple[Clause, ...]:
        """The clauses present in this contract (SLO and placement ones are optional)."""
        out = [Clause.FLOPS, Clause.EFFICIENCY, Clause.BANDWIDTH]
        if self.gpus:
            out.append(Clause.PRECISION)
        if self.latency is not None:
            out += [Clause.LATENCY, Clause.ALLOWANCE]
        if self.archs and self.gpus:
            out.append(Clause.ARCH)
        return tuple(out)


def exact(x: float) -> Fraction:
    """The float's exact value, so Z3 and the reference agree on borderline cases."""
    return Fraction(x)


def facts(contract: Contract, catalog: tuple[GpuClass, ...]) -> ContractFacts:
    rf = contract.compute.request_flops()
    gpus = []
    for g in catalog:
        p = g.peak(contract.compute.precision)
        best = max((v for _, v in g.peak_flops), default=0.0)
        gpus.append(GpuFacts(g.name, g.arch, exact(p if p is not None else best), p is not None, exact(g.hbm_bandwidth)))
    return ContractFacts(
        name=contract.name,
        flops_lo=exact(rf.lo), flops_hi=exact(rf.hi),
        efficiency=exact(contract.compute.efficiency),
        bandwidth=exact(contract.memory.bandwidth_min),
        latency=exact(contract.slo.latency) if contract.slo else None,
        allowance=exact(contract.slo.allowance) if contract.slo else Fraction(0),
        archs=contract.gpu_arch, precision=contract.compute.precision, gpus=tuple(gpus),
    )


def clause_origin(contract: Contract, clause: Clause) -> SourceRef:
    """Where the clause was written; a defaulted field (efficiency) points at the contract."""
    return contract.span_of(clause.value)


def describe(contract: Contract, clause: Clause, f: ContractFacts) -> str:
    """The clause as a person reads it, in the units it was written in."""
    if clause is Clause.FLOPS:
        return f"FLOPs per request {float(f.flops_lo):.3g} .. {float(f.flops_hi):.3g}"
    if clause is Clause.EFFICIENCY:
        written = any(n == clause.value for n, _ in contract.field_origins)
        return f"efficiency {float(f.efficiency):.0%}" + ("" if written else " (the default)")
    if clause is Clause.PRECISION:
        return f"precision `{f.precision}`"
    if clause is Clause.BANDWIDTH:
        return f"memory bandwidth >= {float(f.bandwidth) / 1e9:g} GB/s"
    if clause is Clause.LATENCY:
        return f"SLO latency <= {float(f.latency or 0) * 1e3:g} ms"
    if clause is Clause.ALLOWANCE:
        return f"network/queueing allowance {float(f.allowance) * 1e3:g} ms"
    return f"GPU architectures {', '.join(f.archs)}"
