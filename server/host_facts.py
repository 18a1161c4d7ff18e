"""`ListHosts`: the topology's hosts as the service knows them — the facts `RegisterInstance`
checks a deployment against (`registration.check_facts`), so an operator can read what an
instance on each host may claim instead of learning it one refusal at a time."""

from __future__ import annotations

from policyc.placer.topology import Topology

from .proto import pb


def hosts_msg(topology: Topology | None, region: str = "") -> "pb.ListHostsResponse":
    """Every host of `topology` (only `region`'s when given), sorted by name, each with its
    GPUs sorted by id. No topology: an empty answer with `known` false."""
    if topology is None:
        return pb.ListHostsResponse(known=False)
    gpus: dict[int, list[pb.GpuFacts]] = {}
    for g in topology.gpus:
        numa = topology.numa[g.numa]
        gpus.setdefault(g.host, []).append(pb.GpuFacts(gpu=g.gpu_id, gpu_model=g.model, numa_node=numa.node,
                                                       session_state=numa.store.value))
    out = []
    for i, h in enumerate(topology.hosts):
        if region and h.region != region:
            continue
        gs: list[pb.GpuFacts] = sorted(gpus.get(i, []), key=_gpu_order)
        out.append(pb.HostFacts(host=h.name, region=h.region, cuda=h.cuda, tpm=h.tpm, memory_encryption=h.memory_encryption,
                                hardware_firewall=h.hardware_firewall, tee=h.tee, addresses=list(h.addresses),
                                gpus=gs))
    out.sort(key=lambda x: x.host)
    return pb.ListHostsResponse(hosts=out, known=True)


def _gpu_order(g: "pb.GpuFacts") -> tuple[int, str]:
    """`gpu2` before `gpu10`."""
    return len(g.gpu), g.gpu
