"""Instance classes: contracts grouped by exactly what request rules can tell apart.

Encoding a fleet as one Z3 disjunct per contract makes every rule and diff query grow
with the fleet. Rules read a handful of instance attributes, so contracts that agree on
everything the rules can observe are interchangeable: they become one class, encoded once
(`RuleEncoder.class_domain`), and the class keeps its member names for witnesses.

What a class fixes:
- the deployment choices a contract narrows: region set, security flags, session state,
  declared labels the rules read, and the GPU classes it may use (only when a rule reads
  `gpu_model`/`gpu_arch`; otherwise only that some GPU exists);
- the contract version, when a rule reads it;
- each contract-fixed quantity a rule reads (`slo_latency`, `flops_min`, `flops_max`,
  `bandwidth`) only as its *bucket* among the thresholds it can be compared with: the
  constants compared with the attribute, and for each request variable compared with it,
  that variable's constants and declared range (see `thresholds`);
- the model name as the set of member names (so `model == request.model` stays exact).

Why this is exact for queries over a free request (`abstraction_safe` checks the
conditions): an abstract witness has a member's name and a quantity somewhere in that
member's bucket. Moving the quantity to the member's true value keeps every comparison
with a constant, and a request variable compared with it can be moved inside its own
bucket to keep its order with the quantity, as long as that variable is compared with no
other instance attribute. When the request is fixed (feasibility, the diff's compliance
inner check), its values are added as thresholds and no variable needs to move.
Witnesses are made concrete by re-solving with the one member contract (`diff.py`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from policyc.compiler.bundle import Atom, Contract, RequestRule, Scalar, Test

from .domains import Domains, contract_regions, leaves, usable_gpus

# contract-fixed quantities an instance carries, as read by rules
FIXED_QUANTITIES: tuple[str, ...] = ("slo_latency", "flops_min", "flops_max", "bandwidth")
GPU_ATTRS = frozenset({"gpu_model", "gpu_arch"})


@dataclass(frozen=True, slots=True)
class Bucket:
    """Where a quantity lies among sorted thresholds: exactly at `lo` (lo == hi, closed),
    strictly between two neighbours (either may be None for unbounded), or infinite."""

    lo: float | None
    hi: float | None
    point: bool = False
    infinite: bool = False


@dataclass(frozen=True, slots=True)
class ClassKey:
    regions: tuple[str, ...] | None
    security: tuple[str, ...]
    session: str | None  # None: any session state
    labels: tuple[tuple[str, str | None], ...]  # read label keys -> declared value (None: free)
    gpus: tuple[str, ...] | None  # None: GPU classes not read by rules (some usable GPU exists)
    archs: tuple[str, ...] | None  # only without a catalog, when read
    version: str | None  # only when read
    buckets: tuple[tuple[str, Bucket], ...]


@dataclass(frozen=True, slots=True)
class InstanceClass:
    key: ClassKey
    members: tuple[str, ...]  # contract names, in bundle order


def read_attrs(rules: Iterable[RequestRule]) -> frozenset[str]:
    """Instance attributes that some rule compares."""
    return frozenset(leaf.attr for r in rules for leaf in (*leaves(r.guard), *leaves(r.require)) if isinstance(leaf, Atom))


def _values(v: object) -> tuple[float, ...]:
    xs = v if isinstance(v, tuple) else (v,)
    return tuple(float(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool))


def thresholds(rules: Iterable[RequestRule], dom: Domains, extra: Mapping[str, Scalar] | None = None) -> dict[str, tuple[float, ...]]:
    """Per fixed quantity read by some rule: every value its order can be tested against.

    `extra` is a concrete request: its values of variables compared with the quantity are
    thresholds too, which makes classes exact for that one request.
    """
    rules = tuple(rules)
    atoms = [leaf for r in rules for leaf in (*leaves(r.guard), *leaves(r.require)) if isinstance(leaf, Atom)]
    tests = [leaf for r in rules for leaf in (*leaves(r.guard), *leaves(r.require)) if isinstance(leaf, Test)]
    out: dict[str, set[float]] = {}
    for a in atoms:
        if a.attr not in FIXED_QUANTITIES:
            continue
        pts = out.setdefault(a.attr, set())
        if a.operand.kind == "const":
            pts.update(_values(a.operand.value))
            continue
        var = a.operand.name
        pts.add(0.0)
        vd = dom.vars.get(var)
        if vd is not None and vd.range is not None:
            pts.update((vd.range.lo, vd.range.hi))
        for t in tests:
            if t.var == var and t.operand is not None:
                pts.update(_values(t.operand.value))
        if extra is not None and var in extra:
            pts.update(_values(extra[var]))
    return {k: tuple(sorted(x for x in v if math.isfinite(x))) for k, v in out.items()}


def abstraction_safe(rules: Iterable[RequestRule]) -> bool:
    """Whether classes answer free-request queries exactly (see the module docstring):
    every request variable compared with a fixed quantity is compared with that one
    attribute only."""
    compared: dict[str, set[str]] = {}
    for r in rules:
        for leaf in (*leaves(r.guard), *leaves(r.require)):
            if isinstance(leaf, Atom) and leaf.operand.kind == "var":
                compared.setdefault(leaf.operand.name, set()).add(leaf.attr)
    return all(len(attrs) == 1 for attrs in compared.values() if attrs & set(FIXED_QUANTITIES))


def bucket(x: float, points: tuple[float, ...]) -> Bucket:
    if math.isinf(x):
        return Bucket(None, None, infinite=True)
    i = bisect.bisect_left(points, x)
    if i < len(points) and points[i] == x:
        return Bucket(x, x, point=True)
    return Bucket(points[i - 1] if i > 0 else None, points[i] if i < len(points) else None)


def fixed_quantity(c: Contract, attr: str) -> float:
    """The value an instance of `c` has for a contract-fixed quantity."""
    if attr == "slo_latency":
        return c.slo.latency if c.slo else math.inf
    rf = c.compute.request_flops()
    return {"flops_min": rf.lo, "flops_max": rf.hi, "bandwidth": c.memory.bandwidth_min}[attr]


def class_key(c: Contract, dom: Domains, read: frozenset[str], points: Mapping[str, tuple[float, ...]]) -> ClassKey | None:
    """The class of a contract, or None when no instance of it can exist (no usable GPU)."""
    gpus = usable_gpus(c, dom) if dom.gpus else None
    if gpus is not None and not gpus:
        return None
    labels = dict(c.labels)
    return ClassKey(
        regions=contract_regions(c, dom),
        security=tuple(sorted(set(c.security))),
        session=c.session.state if c.session is not None and c.session.state != "remote" else None,
        labels=tuple((k, labels.get(k)) for k in dom.label_keys),
        gpus=gpus if gpus is not None and read & GPU_ATTRS else None,
        archs=c.gpu_arch if not dom.gpus and c.gpu_arch and "gpu_arch" in read else None,
        version=c.version if "version" in read else None,
        buckets=tuple((a, bucket(fixed_quantity(c, a), points[a])) for a in FIXED_QUANTITIES if a in points),
    )


def group(contracts: Iterable[Contract], dom: Domains, read: frozenset[str],
          points: Mapping[str, tuple[float, ...]]) -> tuple[InstanceClass, ...]:
    """Contracts grouped into classes, in order of first member."""
    members: dict[ClassKey, list[str]] = {}
    for c in contracts:
        key = class_key(c, dom, read, points)
        if key is not None:
            members.setdefault(key, []).append(c.name)
    return tuple(InstanceClass(k, tuple(v)) for k, v in members.items())
