"""Small bundles and brute-force enumeration over finite domains, for the property tests.

Bundles are built directly as bundle models (no source), from a handful of contracts and
rules drawn by hypothesis. The finite domains cover every case the rules can tell apart:
each declared name plus one stranger, each threshold plus the points between them.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from policyc.compiler.bundle import (And, Atom, Bundle, Compute, Const, Contract, Dependencies, GpuClass, HeaderMapping,
                                     Interval, Memory, Not, Or, RequestRule, Slo, SourceRef, Tenant, Test, Var)
from policyc.solver.domains import domains, usable_gpus
from policyc.solver.semantics import admitted, rules_admit

REF = SourceRef(file="gen.contract", line=1, col=1)
REGIONS = ("us-west", "eu-west")
SECURITY = ("tpm", "memory_encryption", "hardware_firewall")
SLOS = (0.1, 0.2)

CATALOG = (
    GpuClass(name="A100-80G", arch="ampere", peak_flops=(("fp16", 312e12),), hbm_bandwidth=2039e9, memory=80e9, origin=REF),
    GpuClass(name="H100", arch="hopper", peak_flops=(("fp16", 989e12),), hbm_bandwidth=3350e9, memory=80e9, origin=REF),
)
HEADERS = (
    HeaderMapping(header="X-Data-Region", var="region", type="name", values=REGIONS, on_missing="ignore", origin=REF),
    HeaderMapping(header="X-SLO-Latency", var="slo", type="time", range=Interval(lo=0.001, hi=60.0), on_missing="ignore", origin=REF),
)
TENANTS = (Tenant(name="bank", tenant_class="finance", origin=REF), Tenant(name="shop", tenant_class="retail", origin=REF))


def contract(name: str, regions: tuple[str, ...], security: tuple[str, ...], slo: float | None, phi: bool) -> Contract:
    return Contract(
        name=name, version="1", origin=REF,
        compute=Compute(flops=Interval(lo=1e11, hi=2e11), per="request", tokens=1),
        memory=Memory(bandwidth_min=100e9, burst_max=0.1), dependencies=Dependencies(),
        slo=Slo(latency=slo) if slo else None, regions=regions, security=security,  # type: ignore[arg-type]
        labels=(("data", "phi"),) if phi else (),
    )


contracts_st = st.lists(
    st.tuples(st.sampled_from([(), ("us-west",), ("eu-west",), REGIONS]),
              st.lists(st.sampled_from(SECURITY), unique=True, max_size=2).map(tuple),
              st.sampled_from((None, *SLOS)), st.booleans()),
    min_size=1, max_size=3,
).map(lambda xs: tuple(contract(f"m{i}", *x) for i, x in enumerate(xs)))

guard_leaf = st.one_of(
    st.sampled_from(["finance", "retail"]).map(lambda c: Test(var="tenant_class", cmp="==", operand=Const(value=c), origin=REF)),
    st.sampled_from(["region", "slo", "tenant"]).map(lambda v: Test(var=v, origin=REF)),
    st.tuples(st.sampled_from(["<", ">="]), st.sampled_from((0.05, 0.15, 0.3, 90.0))).map(
        lambda t: Test(var="slo", cmp=t[0], operand=Const(value=t[1]), origin=REF)),
)
req_leaf = st.one_of(
    st.sampled_from(SECURITY).map(lambda a: Atom(attr=a, cmp="==", operand=Const(value=True), origin=REF)),
    st.sampled_from([*REGIONS, "mars-1"]).map(lambda r: Atom(attr="region", cmp="==", operand=Const(value=r), origin=REF)),
    st.just(Atom(attr="region", cmp="==", operand=Var(name="region"), origin=REF)),
    st.just(Atom(attr="slo_latency", cmp="<=", operand=Var(name="slo"), origin=REF)),
    st.sampled_from((0.05, 0.15, 0.3)).map(lambda x: Atom(attr="slo_latency", cmp="<=", operand=Const(value=x), origin=REF)),
    st.sampled_from(["m0", "m1"]).map(lambda m: Atom(attr="model", cmp="!=", operand=Const(value=m), origin=REF)),
    st.just(Atom(attr="labels.data", cmp="!=", operand=Const(value="phi"), origin=REF)),
)


def _tree(leaf):
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=2).map(lambda a: And(args=tuple(a))),
        st.lists(inner, min_size=2, max_size=2).map(lambda a: Or(args=tuple(a))),
        inner.map(lambda a: Not(arg=a)),
    ), max_leaves=3)


rule_st = st.tuples(st.one_of(st.none(), _tree(guard_leaf)), _tree(req_leaf))
rules_st = st.lists(rule_st, min_size=1, max_size=3).map(
    lambda rs: tuple(RequestRule(id=f"p.r{i}", policy="p", guard=g, require=r, origin=SourceRef(file="gen.contract", line=i + 1, col=1))
                     for i, (g, r) in enumerate(rs)))


def bundle(contracts: tuple[Contract, ...], rules: tuple[RequestRule, ...]) -> Bundle:
    return Bundle(compiler_version="test", contracts=contracts, gpu_catalog=CATALOG, headers=HEADERS, tenants=TENANTS, rules=rules)


def requests() -> list[dict]:
    out = []
    for tenant, region, slo in itertools.product((None, "bank", "shop", "stranger"), (None, *REGIONS),
                                                 (None, 0.001, 0.05, 0.07, 0.1, 0.12, 0.15, 0.17, 0.2, 0.25, 0.3, 1.0, 60.0)):
        r: dict = {}
        if tenant:
            r["tenant"] = tenant
            cls = {"bank": "finance", "shop": "retail"}.get(tenant)
            if cls:
                r["tenant_class"] = cls
        if region:
            r["region"] = region
        if slo is not None:
            r["slo"] = slo
        out.append(r)
    return out


def instances(b: Bundle) -> list[dict]:
    dom = domains(b)
    out = []
    for c in b.contracts:
        regions = c.regions or dom.regions or ("anywhere",)
        for region, gpu, flags in itertools.product(regions, usable_gpus(c, dom), itertools.product((False, True), repeat=len(SECURITY))):
            sec = dict(zip(SECURITY, flags))
            if any(not sec[s] for s in c.security):
                continue
            attrs = {"model": c.name, "version": c.version, "region": region, "gpu_model": gpu,
                     "gpu_arch": dom.gpus[gpu][0], "tee": False, "numa_node": 0.0, "session_state": "remote",
                     "slo_latency": c.slo.latency if c.slo else float("inf"), "flops_min": 1e11, "flops_max": 2e11,
                     "bandwidth": 100e9, "host": "h", **sec}
            if c.labels:  # declared labels are fixed; an instance may add any other
                out.append({**attrs, **{"labels." + k: v for k, v in c.labels}})
            else:
                out += [attrs, {**attrs, "labels.data": "phi"}, {**attrs, "labels.data": "other"}]
    return out


def brute_admitted(b: Bundle) -> set[tuple[int, int]]:
    dom = domains(b)
    reqs, insts = requests(), instances(b)
    return {(i, j) for i, r in enumerate(reqs) for j, a in enumerate(insts) if admitted(b, dom, r, a)}


def brute_rules_hold(rules, req, attrs) -> bool:
    return rules_admit(rules, req, attrs)
