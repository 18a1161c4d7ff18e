"""A realistic fleet of model instances for a cluster: every contract on every GPU slot
whose deployment satisfies it (as an operator's scheduler would place them), optionally
several replicas per slot. Used by the demo and the benchmark; the server itself only
registers what it is told to.
"""

from __future__ import annotations

from typing import Iterable

from policyc.compiler.bundle import Bundle
from policyc.matcher.instance import Instance, admission_problems
from policyc.placer.topology import GpuSlot


def instance_id(model: str, host: str, gpu: str, replica: int = 0) -> str:
    return f"{model}@{host}/{gpu}" + (f"#{replica}" if replica else "")


def admissible_fleet(bundle: Bundle, slots: Iterable[GpuSlot], *, replicas: int = 1,
                     models: Iterable[str] | None = None) -> list[Instance]:
    """Instances for each (contract, slot) pair the bundle admits, `replicas` per pair."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    wanted = set(models) if models is not None else None
    contracts = [c for c in bundle.contracts if wanted is None or c.name in wanted]
    out: list[Instance] = []
    for s in slots:
        d = s.to_deployment()
        for c in contracts:
            probe = Instance(id=instance_id(c.name, s.host, s.gpu), model=c.name, deployment=d)
            if admission_problems(probe, bundle):
                continue
            out.append(probe)
            for r in range(1, replicas):
                out.append(Instance(id=instance_id(c.name, s.host, s.gpu, r), model=c.name, deployment=d,
                                    labels={"replica": str(r)}))
    return out
