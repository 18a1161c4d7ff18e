"""The fleet's declared domains: which requests and which instances a bundle can see.

A request's variables come from header mappings (declared values, ranges, whether they
may be missing) plus `tenant` and `tenant_class` from the tenants table. An instance is a
contract plus a deployment: its contract fixes model, version, SLO, FLOPs, bandwidth and
declared labels, and narrows region, GPU class and security flags; the rest is free.
Regions are closed over what the bundle declares anywhere (contract placements, header
values, rule literals), so `mars-1` is no region at all; GPU classes over the catalog.
Both the Z3 encoding and the brute-force reference read these same facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from policyc.compiler.attributes import BUILTIN_REQUEST_VARS
from policyc.compiler.bundle import And, Atom, Bundle, Contract, Expr, Interval, Not, Or, RequestRule, Test, ValueType
from policyc.compiler.meaning import QUANTITY_KINDS

SESSION_STATES: tuple[str, ...] = ("nvme", "host_memory", "remote")
QUANTITY_TYPES = QUANTITY_KINDS  # the quantity kinds, as the compiler defines them


@dataclass(frozen=True, slots=True)
class VarDomain:
    """One request variable: its type, whether every admitted request has it, and the
    values or range its header declares (None: any well-formed value)."""

    name: str
    type: ValueType
    always_present: bool
    values: tuple[str, ...] | None = None
    range: Interval | None = None


@dataclass(frozen=True, slots=True)
class Domains:
    vars: dict[str, VarDomain]
    tenants: dict[str, str]  # tenant -> class
    regions: tuple[str, ...] | None  # None: no region declared anywhere, so any
    gpus: dict[str, tuple[str, float]]  # GPU class -> (arch, HBM bytes/s)
    label_keys: tuple[str, ...]  # label keys that some rule reads


def leaves(e: Expr | None):
    """Every Atom and Test in an expression, in source order."""
    match e:
        case Atom() | Test():
            yield e
        case And(args=args) | Or(args=args):
            for a in args:
                yield from leaves(a)
        case Not(arg=arg):
            yield from leaves(arg)


def reads(rule: RequestRule) -> frozenset[str]:
    """The request variables a rule reads; a request lacking any of them skips the rule."""
    out = set()
    for leaf in (*leaves(rule.guard), *leaves(rule.require)):
        if isinstance(leaf, Test):
            out.add(leaf.var)
        elif isinstance(leaf, Atom) and leaf.operand.kind == "var":
            out.add(leaf.operand.name)
    return frozenset(out)


def _consts(leaf: Atom | Test) -> tuple:
    if leaf.operand is None or leaf.operand.kind != "const":
        return ()
    v = leaf.operand.value
    return v if isinstance(v, tuple) else (v,)


def domains(bundle: Bundle) -> Domains:
    vars_: dict[str, VarDomain] = {}
    for name, t in BUILTIN_REQUEST_VARS.items():
        vars_[name] = VarDomain(name, t, always_present=False)
    for h in bundle.headers:
        vars_[h.var] = VarDomain(h.var, h.type, always_present=h.on_missing in ("reject", "default"),
                                 values=h.values or None, range=h.range)
    regions: set[str] = set()
    for c in bundle.contracts:
        regions.update(c.regions)
    label_keys: set[str] = set()
    for r in bundle.rules:
        for leaf in (*leaves(r.guard), *leaves(r.require)):
            if isinstance(leaf, Atom):
                if leaf.attr.startswith("labels."):
                    label_keys.add(leaf.attr[len("labels."):])
                if leaf.attr == "region":
                    regions.update(str(v) for v in _consts(leaf))
                    if leaf.operand.kind == "var":
                        vd = vars_.get(leaf.operand.name)
                        if vd and vd.values:
                            regions.update(vd.values)
    return Domains(
        vars=vars_,
        tenants={t.name: t.tenant_class for t in bundle.tenants},
        regions=tuple(sorted(regions)) or None,
        gpus={g.name: (g.arch, g.hbm_bandwidth) for g in bundle.gpu_catalog},
        label_keys=tuple(sorted(label_keys)),
    )


def usable_gpus(contract: Contract, dom: Domains) -> tuple[str, ...]:
    """GPU classes an instance of this contract may run on (architecture and bandwidth)."""
    return tuple(name for name, (arch, hbm) in sorted(dom.gpus.items())
                 if (not contract.gpu_arch or arch in contract.gpu_arch) and hbm >= contract.memory.bandwidth_min)


def contract_regions(contract: Contract, dom: Domains) -> tuple[str, ...] | None:
    """Regions an instance of this contract may be in (None: any name)."""
    if contract.regions:
        return contract.regions
    return dom.regions
