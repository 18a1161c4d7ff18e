"""Declared dependencies the example contracts use: an `http` API (the recommender's
catalog-api) bound over the fabric to its region's endpoint, and an `nvme` store (the
support chatbot's conversation-store) bound to the session store on the GPU's own NUMA
node."""

from __future__ import annotations

from placer_support import REF, contract, instances

from policyc.compiler.bundle import ServiceDependency, Session
from policyc.placer import Constraint, NoPlacement, PlacementPlan, Placer, Refresher, SimulatedCluster
from policyc.placer.stores import STORE_P99, store_table
from policyc.placer.topology import EndpointRole, StoreKind


def _svc(kind: str, p99: float, name: str = "dep") -> ServiceDependency:
    return ServiceDependency(name=name, kind=kind, p99=p99, origin=REF)


def _world(seed: int = 5) -> tuple[SimulatedCluster, Placer, Refresher]:
    sim = SimulatedCluster(seed, 8, 4, hosts_per_rack=2)
    r = Refresher(sim)
    r.tick()
    return sim, Placer(r), r


def test_every_region_has_a_direct_http_endpoint() -> None:
    sim, _, _ = _world()
    t = sim.topology()
    http = {e.region: e for e in t.endpoints if e.kind == "http"}
    assert set(http) == set(t.ingress) and all(e.role is EndpointRole.DIRECT for e in http.values())
    assert {e.name for e in http.values()} == {f"http-{r}" for r in t.ingress}


def test_http_dependency_binds_to_the_regions_endpoint() -> None:
    sim, placer, _ = _world()
    plan = placer.place(instances(sim), 0.2, contract(services=(_svc("http", 30e-3, "catalog-api"),)))
    assert isinstance(plan, PlacementPlan)
    (b,) = plan.dependencies
    region = next(s.region for s in sim.gpu_slots() if f"{s.host}/{s.gpu}" == plan.gpu_key)
    assert b.service == "catalog-api" and b.endpoint == f"http-{region}" and b.role == "direct"
    assert 12e-3 * 0.7 < b.predicted <= 30e-3 and plan.latency.dependencies == b.predicted
    assert any(x.startswith("dependency `catalog-api` bound to direct endpoint `http-") for x in plan.reasons)


def test_a_slow_http_tier_is_a_dependency_refusal_naming_the_endpoint() -> None:
    sim, placer, r = _world()
    for region in sim.topology().ingress:
        sim.service_p99(f"http-{region}", 0.5, ticks=1)
    r.tick()
    got = placer.place(instances(sim), 0.2, contract(services=(_svc("http", 30e-3, "catalog-api"),)))
    assert isinstance(got, NoPlacement) and got.binding is Constraint.DEPENDENCY
    assert "catalog-api" in got.message and "answers in 50" in got.message
    r.tick()  # the pin expires: bound again
    assert isinstance(placer.place(instances(sim), 0.2, contract(services=(_svc("http", 30e-3),))), PlacementPlan)


def test_nvme_dependency_is_the_store_on_the_gpus_numa_node() -> None:
    sim, placer, _ = _world()
    t = sim.topology()
    st = store_table(t, "nvme")
    with_store = {t.gpu_key(i) for i in range(len(t.gpus)) if t.numa[t.gpus[i].numa].store is StoreKind.NVME}
    assert 0 < len(with_store) < len(t.gpus)  # the seed gives both kinds of NUMA node
    assert len(st.endpoints) == sum(n.store is StoreKind.NVME for n in t.numa)
    plan = placer.place(instances(sim), 1.5, contract(services=(_svc("nvme", 4e-3, "conversation-store"),)))
    assert isinstance(plan, PlacementPlan) and plan.gpu_key in with_store
    (b,) = plan.dependencies
    assert b.role == "local" and b.endpoint == f"{plan.host}/numa{plan.numa_node}/nvme"
    assert b.predicted == STORE_P99[StoreKind.NVME] and plan.latency.dependencies == b.predicted


def test_gpus_without_an_nvme_store_fail_the_dependency_and_say_why() -> None:
    sim, placer, _ = _world()
    t = sim.topology()
    others = [t.gpu_key(i) for i in range(len(t.gpus)) if t.numa[t.gpus[i].numa].store is not StoreKind.NVME]
    got = placer.place(instances(sim, keys=others), 1.5, contract(services=(_svc("nvme", 4e-3, "conversation-store"),)))
    assert isinstance(got, NoPlacement) and got.binding is Constraint.DEPENDENCY
    assert all(x.constraint is Constraint.DEPENDENCY for x in got.rejected)
    assert "`conversation-store` is the `nvme` session store, and this GPU's NUMA node has none" in got.rejected[0].detail


def test_a_store_slower_than_the_bound_is_refused_with_its_latency() -> None:
    sim, placer, _ = _world()
    got = placer.place(instances(sim), 1.5, contract(services=(_svc("nvme", 1e-3, "st"),)))
    assert isinstance(got, NoPlacement) and got.binding is Constraint.DEPENDENCY
    assert "answers in 3.2 ms" in got.message and "/nvme`" in got.message


def test_chatbot_shape_session_and_store_agree() -> None:
    sim, placer, _ = _world()
    c = contract(services=(_svc("nvme", 4e-3, "conversation-store"),), session=Session(state="nvme", colocate="same_numa"))
    plan = placer.place(instances(sim), 1.5, c, session="conv-1")
    assert isinstance(plan, PlacementPlan)
    assert plan.dependencies[0].endpoint == f"{plan.host}/numa{plan.numa_node}/nvme"
    again = placer.place(instances(sim), 1.5, c, session="conv-1")
    assert isinstance(again, PlacementPlan) and again.gpu_key == plan.gpu_key


def test_a_topology_without_nvme_stores_says_so() -> None:
    sim = SimulatedCluster(9, 2, 2, numa_per_host=1, hosts_per_rack=2)  # seed 9: both NUMA nodes `remote`
    t = sim.topology()
    assert all(n.store is StoreKind.REMOTE for n in t.numa) and store_table(t, "nvme").endpoints == ()
    got = Placer(Refresher(sim)).place(instances(sim), 1.5, contract(services=(_svc("nvme", 4e-3, "st"),)))
    assert isinstance(got, NoPlacement) and got.binding is Constraint.DEPENDENCY
    assert "no NUMA node in the topology has a `nvme` session store for dependency `st`" in got.rejected[0].detail
