"""The demo's real model servers: which registered instances are real KServe servers, on
which GPU slots of the simulated cluster they are placed, how they are started, and how
they register (their ONNX model carrying the contract, and their endpoint).

Five instances in two processes (a process costs about a second of CPU to start; each
instance still has its own gRPC port, its endpoint), enough for every scene of the mix:

- two `fraud-scorer` primaries on finance-hardened us-west hosts (different hosts, so
  different RDMA ports: the congestion scene moves traffic from one to the other), with
  stall control so the budget scene can slow one request on its server;
- one `fraud-scorer-lite` backup on a third finance-hardened us-west host, with its simplified
  variant, also answering `fraud-scorer` (Envoy retries the primary's request body);
- one `recommender` in us-west and one `clinical-notes` in eu-west.

Every other instance of the simulated fleet stays for placement at scale, without an
endpoint: the picker never sends traffic to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from policyc.compiler.bundle import Bundle, Redirect
from policyc.matcher import Instance
from policyc.matcher.instance import admission_problems
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import ModelFiles, write_model_files
from policyc.placer.topology import GpuSlot
from policyc.server.fleet import instance_id


class PoolPlanError(RuntimeError):
    """The simulated cluster has no slot a real instance of the scenario needs."""


@dataclass(frozen=True, slots=True)
class RealInstance:
    """A registered instance that is a real model server."""

    id: str
    model: str
    slot: GpuSlot
    role: str  # "primary", "backup" or "serving"
    process: int  # which of the pool's processes serves it

    def instance(self, endpoint: str = "") -> Instance:
        d = self.slot.to_deployment()
        if endpoint:
            d = d.model_copy(update={"endpoint": endpoint})
        return Instance(id=self.id, model=self.model, deployment=d)


def _finance(s: GpuSlot) -> bool:
    return s.tpm and s.memory_encryption and s.hardware_firewall


def pick_slot(bundle: Bundle, slots: Iterable[GpuSlot], model: str, *, region: str | None = None,
          finance: bool = False, avoid_hosts: set[str]) -> GpuSlot:
    for s in slots:
        if s.host in avoid_hosts or (region is not None and s.region != region) or (finance and not _finance(s)):
            continue
        probe = Instance(id="probe", model=model, deployment=s.to_deployment())
        if not admission_problems(probe, bundle):
            return s
    raise PoolPlanError(f"no GPU slot of the simulated cluster can hold a real `{model}` instance"
                        + (f" in {region}" if region else "") + (" with finance hardening" if finance else ""))


def plan(bundle: Bundle, slots: Iterable[GpuSlot], rank: Callable[[GpuSlot], float] | None = None) -> list[RealInstance]:
    """Where the real instances go: for each, the first admissible slot in `rank` order
    (highest first; e.g. the free GPU share now, as a scheduler places serving replicas
    where there is room), on a host no other real instance uses."""
    slots = tuple(sorted(slots, key=lambda s: -rank(s))) if rank is not None else tuple(slots)
    used: set[str] = set()
    out: list[RealInstance] = []

    def add(model: str, role: str, process: int, **where: object) -> None:
        s = pick_slot(bundle, slots, model, avoid_hosts=used, **where)  # type: ignore[arg-type]
        used.add(s.host)
        out.append(RealInstance(instance_id(model, s.host, s.gpu), model, s, role, process))

    add("fraud-scorer", "primary", 0, region="us-west", finance=True)
    add("fraud-scorer", "primary", 0, region="us-west", finance=True)
    add("fraud-scorer-lite", "backup", 1, region="us-west", finance=True)
    add("recommender", "serving", 1, region="us-west")
    add("clinical-notes", "serving", 1, region="eu-west")
    return out


def retried_here(bundle: Bundle, backup: str) -> tuple[str, ...]:
    """The models whose breakers redirect to `backup`: the names whose retried request
    bodies it must answer (a breaker without `models` covers every contract)."""
    out: set[str] = set()
    for b in bundle.breakers:
        if any(isinstance(a, Redirect) and a.backup == backup for a in b.actions):
            out.update(b.models or (c.name for c in bundle.contracts))
    out.discard(backup)
    return tuple(sorted(out))


def model_files(bundle: Bundle, real: list[RealInstance], workdir: Path) -> dict[str, ModelFiles]:
    """Each model's ONNX files (its contract embedded; a backup's simplified variant too) under `workdir/models`."""
    files: dict[str, ModelFiles] = {}
    for r in real:
        if r.model not in files:
            contract = bundle.contract(r.model)
            if contract is None:
                raise PoolPlanError(f"the bundle has no contract `{r.model}`")
            files[r.model] = write_model_files(contract, workdir / "models", simplified=r.role == "backup")
    return files


def start_pool(bundle: Bundle, real: list[RealInstance], workdir: Path, *, timeout: float = 60.0) -> ModelPool:
    """Write each model's ONNX files (contract embedded) and start the processes in parallel."""
    files = model_files(bundle, real, workdir)
    by_process: dict[int, list[InstanceSpec]] = {}
    stall: dict[int, bool] = {}
    for r in real:
        f = files[r.model]
        backup = r.role == "backup"
        by_process.setdefault(r.process, []).append(InstanceSpec(
            r.id, f.full, f.simplified if backup else None, name=r.model,
            aliases=retried_here(bundle, r.model) if backup else ()))
        stall[r.process] = stall.get(r.process, False) or r.role == "primary"
    specs = [ServerSpec(tuple(by_process[n]), stall_control=stall[n]) for n in sorted(by_process)]
    return ModelPool(specs, workdir=workdir / "servers").start(timeout=timeout)
