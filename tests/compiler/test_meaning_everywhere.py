"""A contract means one thing everywhere: the GPU share, the instance attributes and the
FLOPs of random contracts are the same in every consumer (they all call
`policyc.compiler.meaning`), and after a reload with a new GPU catalog the live placer
reserves exactly the shares the new bundle stores."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.audit.accounting import estimated_figures
from policyc.compiler import bundle_io, meaning
from policyc.compiler.bundle import (
    Compute, Contract, Dependencies, GpuClass, Interval, Memory, Slo, SourceRef,
)
from policyc.compiler.pipeline import compile_paths
from policyc.matcher.instance import Deployment, Instance, attributes
from policyc.placer.contract_table import contract_table
from policyc.placer.plan import ShareSource
from policyc.placer.shares import share_bounds
from policyc.placer.catalog import DEFAULT_CATALOG
from policyc.placer.simulator import SimulatedCluster
from policyc.solver.domains import domains
from policyc.solver.encode import RuleEncoder
from policyc.solver.semantics import contract_admits
from policyc.solver.shares import gpu_share, gpu_shares
from policyc.solver.space import Space
from policyc.server.app import DecisionServer
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.fleet import admissible_fleet

REF = SourceRef(file="t.contract", line=1, col=1)
REPO = Path(__file__).resolve().parents[2]
ARCHS = ("ampere", "hopper", "ada")
PRECISIONS = ("fp16", "bf16", "fp8", "tf32")

positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def contracts(draw: st.DrawFn) -> Contract:
    lo = draw(st.floats(min_value=1e6, max_value=1e14))
    hi = lo * draw(st.floats(min_value=1.0, max_value=4.0))
    per = draw(st.sampled_from(("request", "token")))
    latency = draw(st.floats(min_value=1e-3, max_value=10.0))
    slo = draw(st.one_of(st.none(), st.builds(lambda a: Slo(latency=latency, allowance=latency * a),
                                              st.floats(min_value=0.0, max_value=1.2))))
    return Contract(
        name=draw(st.sampled_from(("m", "fraud-scorer", "x1"))), version=draw(st.sampled_from(("1.0", "2.3.0"))),
        compute=Compute(flops=Interval(lo=lo, hi=hi), per=per, tokens=draw(st.integers(1, 4096)),
                        precision=draw(st.sampled_from(PRECISIONS)), efficiency=draw(st.floats(min_value=0.01, max_value=1.0))),
        memory=Memory(bandwidth_min=draw(st.floats(min_value=1e6, max_value=6e12)), burst_max=0.2),
        dependencies=Dependencies(), slo=slo,
        gpu_arch=tuple(sorted(draw(st.sets(st.sampled_from(ARCHS), max_size=2)))),
        labels=tuple(sorted(draw(st.dictionaries(st.sampled_from(("team", "tier")), st.sampled_from(("a", "b")), max_size=2)).items())),
        origin=REF,
    )


@st.composite
def gpus(draw: st.DrawFn, name: str | None = None, arch: str | None = None) -> GpuClass:
    peaks = draw(st.dictionaries(st.sampled_from(PRECISIONS), st.floats(min_value=1e12, max_value=4e15), min_size=1))
    return GpuClass(name=name or draw(st.sampled_from(("A100-80G", "H100", "L4"))), arch=arch or draw(st.sampled_from(ARCHS)),
                    peak_flops=tuple(sorted(peaks.items())), hbm_bandwidth=draw(st.floats(min_value=1e11, max_value=8e12)),
                    memory=80e9, origin=REF)


@settings(max_examples=200, deadline=None)
@given(contracts(), gpus())
def test_the_share_is_one_function(c: Contract, g: GpuClass) -> None:
    m = meaning.contract_share(c, g)
    # the solver's bound, which the bundle stores
    stored = gpu_share(c, g)
    assert (stored.feasible, stored.min_share, stored.binding, stored.detail) == (m.feasible, m.min_share, m.binding.value, m.detail)
    # the placer, from the bundle's stored share and from the catalog when none is stored
    with_store = share_bounds(c.model_copy(update={"gpu_shares": (stored,)}), [g.name], {g.name: g})[g.name]
    from_catalog = share_bounds(c, [g.name], {g.name: g})[g.name]
    for b, source in ((with_store, ShareSource.SOLVER), (from_catalog, ShareSource.CATALOG)):
        assert b.source is source and b.feasible == m.feasible
        if m.feasible:
            assert b.min_share == m.min_share
    # the semantics decided once: the bandwidth term counts, no SLO means bandwidth only
    if m.feasible:
        bw = c.memory.bandwidth_min / g.hbm_bandwidth
        assert m.min_share is not None and m.min_share >= bw
        if c.slo is None:
            assert m.min_share == bw and m.binding is meaning.Binding.BANDWIDTH


@pytest.fixture(scope="module")
def topology():  # type: ignore[no-untyped-def]
    return SimulatedCluster(3, 4, 2, hosts_per_rack=2).topology()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=contracts(), figures=st.lists(gpus(), min_size=len(DEFAULT_CATALOG), max_size=len(DEFAULT_CATALOG)))
def test_the_placers_table_is_the_share_and_the_rate(topology, c: Contract, figures: list[GpuClass]) -> None:  # type: ignore[no-untyped-def]
    # the simulated fleet's GPU classes, with random figures
    by_name = {d.name: f.model_copy(update={"name": d.name}) for d, f in zip(DEFAULT_CATALOG, figures)}
    table = contract_table(c, topology, by_name)
    names, idx = topology.gpu_models
    assert table.flops == meaning.request_flops(c.compute).hi
    for i, model in enumerate(idx.tolist()):
        g = by_name[names[model]]
        m = meaning.contract_share(c, g)
        rate = meaning.compute_rate(c.compute, g)
        if m.feasible and rate is not None:
            assert m.min_share is not None
            assert table.min_share[i] == m.min_share
            assert table.peak_eff[i] == rate and not table.no_peak[i]
            share = max(m.min_share, meaning.MIN_SHARE)
            assert meaning.compute_seconds(table.flops, table.peak_eff[i], share) == table.flops / (rate * share)


@settings(max_examples=200, deadline=None)
@given(contracts(), gpus())
def test_attributes_and_flops_are_one_function(c: Contract, g: GpuClass) -> None:
    flops = meaning.request_flops(c.compute)
    k = c.compute.tokens if c.compute.per == "token" else 1
    assert (flops.lo, flops.hi) == (c.compute.flops.lo * k, c.compute.flops.hi * k)
    assert c.compute.request_flops() == Interval(lo=flops.lo, hi=flops.hi)
    fixed = meaning.fixed_attributes(c)
    assert fixed["slo_latency"] == (c.slo.latency if c.slo else math.inf)
    # the matcher's view of an instance
    inst = Instance(id="i", model=c.name, deployment=Deployment(host="h", gpu="gpu0", gpu_model=g.name, region="us-west"),
                    labels={"tier": "z"})
    from policyc.compiler.bundle import Bundle
    bundle = Bundle(compiler_version="t", contracts=(c,), gpu_catalog=(g,))
    attrs = attributes(inst, c, bundle)
    assert {k: attrs[k] for k in meaning.CONTRACT_ATTRIBUTES} == fixed
    assert attrs["labels.tier"] == "z"  # the instance's label wins over the contract's
    # the solver's reference semantics: the same attributes describe an instance of the contract
    dom = domains(bundle)
    if (not c.gpu_arch or g.arch in c.gpu_arch) and g.hbm_bandwidth >= c.memory.bandwidth_min:
        assert contract_admits(c, dom, attrs)
    assert not contract_admits(c, dom, {**attrs, "flops_max": fixed["flops_max"] * 2 + 1})
    # the solver's encoding pins the same quantities
    space = Space()
    enc = RuleEncoder(space, dom)
    s = z3.Solver()
    s.add(enc.contract_domain(c))
    for name in ("flops_min", "flops_max", "bandwidth"):
        s.push()
        s.add(space.attr(name).value != space.const("real", meaning.fixed_quantity(c, name)))
        assert s.check() == z3.unsat, name
        s.pop()
    # the audit's GPU-seconds: the contract's FLOPs at the GPU's rate
    rate = meaning.compute_rate(c.compute, g)
    est = estimated_figures(c, g, 1.0)
    if rate is not None and rate > 0:
        assert est["gpu_seconds"]["high"] == meaning.compute_seconds(flops.hi, rate, 1.0)
        assert est["gpu_seconds"]["low"] == meaning.compute_seconds(flops.lo, rate, 1.0)
    else:
        assert "gpu_seconds" not in est


# ----------------------------------------------------------------------- reload


@pytest.fixture(scope="module")
def server() -> DecisionServer:
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    b = r.bundle
    b = bundle_io.seal(b.model_copy(update={"contracts": tuple(c.model_copy(update={"gpu_shares": gpu_shares(c, b.gpu_catalog)})
                                                               for c in b.contracts)}))
    srv = DecisionServer(b, ServeConfig(cluster=ClusterSpec(seed=2, hosts=8, gpus_per_host=4, hosts_per_rack=4),
                                        start_refresher=False, settle_heap=False))
    assert srv.cluster is not None
    srv.engine.register_many(admissible_fleet(b, srv.cluster.gpu_slots()))
    return srv


@st.composite
def new_catalogs(draw: st.DrawFn, base: tuple[GpuClass, ...]) -> tuple[GpuClass, ...]:
    """The same classes (names and architectures: the fleet stays admissible) with new figures."""
    out = []
    for g in base:
        scale = draw(st.floats(min_value=0.25, max_value=4.0))
        out.append(g.model_copy(update={"peak_flops": tuple((p, v * scale) for p, v in g.peak_flops),
                                        "hbm_bandwidth": g.hbm_bandwidth * draw(st.floats(min_value=1.0, max_value=3.0))}))
    return tuple(out)


def test_the_bundle_and_the_live_placer_agree_after_a_reload(server: DecisionServer) -> None:
    base = server.engine.state.bundle

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(new_catalogs(base.gpu_catalog))
    def check(catalog: tuple[GpuClass, ...]) -> None:
        new = bundle_io.seal(base.model_copy(update={
            "gpu_catalog": catalog,
            "contracts": tuple(c.model_copy(update={"gpu_shares": gpu_shares(c, catalog)}) for c in base.contracts)}))
        server.engine.reload(new, evict_inadmissible=True)
        live = server.placer.catalog
        for g in catalog:
            assert live[g.name] == g  # the reload replaced the placer's catalog
        for c in server.engine.state.bundle.contracts:
            stored = {s.gpu: s for s in c.gpu_shares}
            for name, b in server.placer.bounds(c).items():
                s = stored.get(name)
                if s is None:  # a class of the simulated fleet the bundle lacks: meaning's share on the placer's catalog
                    m = meaning.contract_share(c, live[name])
                    assert b.source is ShareSource.CATALOG and b.feasible == m.feasible
                    continue
                assert b.source is ShareSource.SOLVER and b.feasible == s.feasible
                if s.feasible:
                    assert b.min_share == s.min_share == meaning.contract_share(c, live[name]).min_share

    check()
