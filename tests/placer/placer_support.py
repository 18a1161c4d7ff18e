"""Shared builders: contracts and instances for placer tests (no compiler needed)."""

from __future__ import annotations

import pytest

from policyc.compiler.bundle import (
    Compute, Contract, Dependencies, Interval, Memory, ServiceDependency, Session, Slo, SourceRef,
)
from policyc.matcher.instance import Instance
from policyc.placer import SimulatedCluster

REF = SourceRef(file="tests/placer.contract", line=1, col=1)


def contract(
    name: str = "recommender", flops: float = 1.5e12, slo: float = 0.2, services: tuple[ServiceDependency, ...] = (),
    session: Session | None = None, gpu_shares: tuple = (),
) -> Contract:
    return Contract(
        name=name, version="1", compute=Compute(flops=Interval(lo=flops * 0.8, hi=flops), per="request", tokens=128),
        memory=Memory(bandwidth_min=80e9, burst_max=0.2), dependencies=Dependencies(services=services),
        slo=Slo(latency=slo, allowance=0.02), session=session, origin=REF, gpu_shares=gpu_shares,
    )


def redis(p99: float = 5e-3, proxy: str = "none") -> ServiceDependency:
    return ServiceDependency(name="cache", kind="redis", p99=p99, proxy=proxy, origin=REF)


def instances(sim: SimulatedCluster, model: str = "recommender", keys: list[str] | None = None) -> list[Instance]:
    out = []
    for s in sim.gpu_slots():
        key = f"{s.host}/{s.gpu}"
        if keys is None or key in keys:
            out.append(Instance(id=f"{model}@{key}", model=model, deployment=s.to_deployment()))
    return out


@pytest.fixture
def sim() -> SimulatedCluster:
    return SimulatedCluster(seed=7, hosts=4, gpus_per_host=4, hosts_per_rack=2)


def replay(requests: int, *, budget=lambda i: 0.2, before_each=lambda placer, refresher: None) -> list:  # type: ignore[no-untyped-def]
    """A fixed request script on a small cluster: bursts of 30 within a tick, 8 random
    candidates each, a Redis dependency on a dedicated proxy, sessions and sticky keys.
    Returns each outcome as comparable data: (gpu, latency, reasons, rejections) for a
    plan, the refusal itself otherwise. `before_each` may reset a placer's memos."""
    import numpy as np

    from policyc.placer import PlacementPlan, Placer, Refresher

    sim = SimulatedCluster(7, 24, 4, hosts_per_rack=6)
    now = [0.0]
    r = Refresher(sim, clock=lambda: now[0])
    r.tick()
    placer = Placer(r, clock=lambda: now[0])
    cands = instances(sim)
    rng = np.random.default_rng(5)
    c = contract(flops=6e12, services=(redis(proxy="dedicated"),))
    out = []
    for i in range(requests):
        if i % 30 == 29:
            now[0] += 0.2
            r.tick()
        before_each(placer, r)
        pick = [cands[j] for j in rng.choice(len(cands), 8, replace=False)]
        plan = placer.place(pick, budget(i), c, session=f"s{i % 5}" if i % 3 == 0 else None, affinity_key=f"k{i % 4}")
        out.append((plan.gpu_key, plan.latency, plan.reasons, plan.rejected) if isinstance(plan, PlacementPlan) else plan)
    return out
