"""An instance's deployment claims against what its host's own agent discovered
(`host_hardware.py`): the one rule, used wherever an instance enters a replica's registry
(RegisterInstance through the shared engine, the store's snapshot at start, its watch and
its reloads: `Replica.store_problem`), and by the agent itself, which fills the facts a
supervised server's instance leaves out from its host (`fill`).

| claim | the host's fact it must equal | when the host has it |
| --- | --- | --- |
| `deployment.gpu` | one of the GPU ids NVML lists (`gpu0`…) | NVML readable on the host |
| `deployment.gpu_model` | that GPU's catalog class (NVML's name, `placer.nvml.gpu_class`) | NVML |
| `deployment.numa_node` | that GPU's NUMA node (`/sys/bus/pci/devices/<bus>/numa_node`) | the kernel says |
| `deployment.cuda` | the CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion`) | NVML gives it |
| `deployment.region` | the operator's region in the agent's configuration | configured |
| `deployment.hardware_firewall` | the operator's hardware-firewall fact | configured |

A fact the host's agent does not report is not judged here (the topology's check,
`server/registration.check_facts`, still is); a `tpm` claim is judged by attestation
(`attestation.py`, E732). A contradiction is FAILED_PRECONDITION, code E733, naming the
field, the claim, the host's value and where the agent read it.
"""

from __future__ import annotations

from typing import Any

from policyc.matcher import Instance
from policyc.server.errors import ServiceError, Status

from .host_facts import HostFacts
from .host_hardware import Hardware

CODE = "E733"


def host_values(hw: Hardware, gpu: str) -> dict[str, tuple[object, str]]:
    """claim field -> (the host's value, its source), for each fact the host reports about
    a deployment on its GPU `gpu` (`gpu` itself: the GPUs it has, when it has one of them)."""
    src = hw.sources
    out: dict[str, tuple[object, str]] = {}
    g = hw.gpu(gpu)
    if g is not None:
        out["gpu_model"] = (g.gpu_class, src.get("gpus", "NVML"))
        if g.numa_node is not None:
            out["numa_node"] = (g.numa_node, src.get("gpus", "NVML"))
    if hw.cuda is not None:
        out["cuda"] = (hw.cuda, src.get("cuda", "NVML"))
    if hw.site.region is not None:
        out["region"] = (hw.site.region, src.get("site.region", "the agent's configuration"))
    if hw.site.hardware_firewall is not None:
        out["hardware_firewall"] = (hw.site.hardware_firewall, src.get("site.hardware_firewall", "the agent's configuration"))
    return out


def _show(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def claims_problem(inst: Instance, facts: HostFacts | None) -> ServiceError | None:
    """The refusal of the first claim of `inst` its host's agent contradicts, or None (no
    report from that host, or one that agrees)."""
    if facts is None or facts.hardware is None or facts.host != inst.deployment.host:
        return None
    hw, d = facts.hardware, inst.deployment
    if hw.gpus is not None and hw.gpu(d.gpu) is None:
        has = ", ".join(g.id for g in hw.gpus) or "no GPU"
        return _refused(inst, "gpu", d.gpu, f"host `{d.host}`'s agent reports {has} ({hw.sources.get('gpus', 'NVML')})")
    for name, (truth, source) in host_values(hw, d.gpu).items():
        claimed = getattr(d, name)
        if claimed != truth:
            of = f"{d.host}/{d.gpu}" if name in ("gpu_model", "numa_node") else d.host
            return _refused(inst, name, claimed, f"host `{d.host}`'s agent reports {of} as `{_show(truth)}` ({source})")
    return None


def _refused(inst: Instance, fact: str, claimed: object, known: str) -> ServiceError:
    field = f"deployment.{fact}"
    return ServiceError(Status.FAILED_PRECONDITION, f"instance `{inst.id}`: `{field}` is `{_show(claimed)}` but {known}",
                        (f"{field}: the host's own agent reports otherwise",), field=field, code=CODE,
                        info={"rule": "host-facts"})


def fill(deployment: dict[str, Any], facts: HostFacts, where: str) -> dict[str, Any]:
    """A supervised server's deployment (as its JSON gives it) with the facts it leaves out
    taken from its host (GPU class, the GPU's NUMA node, CUDA, region, hardware firewall);
    ValueError naming `where` and the field for one it gives that the host contradicts."""
    hw = facts.hardware
    if hw is None:
        return deployment
    out = dict(deployment)
    gpu = str(out.get("gpu", ""))
    if hw.gpus is not None and gpu and hw.gpu(gpu) is None:
        raise ValueError(f"{where}: `deployment.gpu` `{gpu}`: this host has {', '.join(g.id for g in hw.gpus) or 'no GPU'}")
    for name, (truth, source) in host_values(hw, gpu).items():
        if name not in out:
            out[name] = truth
        elif out[name] != truth:
            raise ValueError(f"{where}: `deployment.{name}` is `{_show(out[name])}` but this host's is `{_show(truth)}` ({source})")
    return out


__all__ = ["CODE", "claims_problem", "fill", "host_values"]
