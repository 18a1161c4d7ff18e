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
