"""The cluster's structure: hosts, NUMA nodes, GPUs, NICs / RDMA ports, switches, ingress
gateways and service endpoints.

Structure changes rarely (a host joins, a rack is added); telemetry changes every tick.
Keeping them apart lets the refresher rebuild only the numbers each 200 ms while the
structure, its index arrays and its networkx graph are built once per topology version.
`graph()` is the full networkx view (hosts, GPUs, NUMA nodes, NICs, switches, endpoints)
with static edge weights; the snapshot overlays the live weights on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

import networkx as nx
import numpy as np

from policyc.matcher.instance import Deployment


class NodeKind(str, Enum):
    HOST = "host"
    NUMA = "numa"
    GPU = "gpu"
    NIC = "nic"
    LEAF = "leaf"
    SPINE = "spine"
    CORE = "core"
    INGRESS = "ingress"
    ENDPOINT = "endpoint"


class EndpointRole(str, Enum):
    """How a service endpoint relates to the service: the service itself, a proxy shared by
    many tenants, a cache proxy dedicated to the policies that ask for one, or a session
    store on the GPU's own NUMA node (reached over PCIe, never over the fabric)."""

    DIRECT = "direct"
    SHARED_PROXY = "shared"
    DEDICATED_PROXY = "dedicated"
    LOCAL = "local"


class StoreKind(str, Enum):
    NVME = "nvme"
    HOST_MEMORY = "host_memory"
    REMOTE = "remote"


@dataclass(frozen=True, slots=True)
class HostInfo:
    name: str
    region: str
    tpm: bool
    memory_encryption: bool
    hardware_firewall: bool
    tee: bool
    cuda: str = "12.4"
    # the IP addresses the host's model servers answer on, as its topology source knows them:
    # a registered instance's endpoint must be one of its claimed host's (server/endpoint_rules.py)
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NumaInfo:
    host: int  # index into Topology.hosts
    node: int  # NUMA node id within the host
    cpus: tuple[int, ...]
    store: StoreKind  # session store attached to this NUMA node


@dataclass(frozen=True, slots=True)
class GpuInfo:
    host: int
    numa: int  # index into Topology.numa
    gpu_id: str  # "gpu3"
    model: str  # catalog class


@dataclass(frozen=True, slots=True)
class PortInfo:
    """A NIC / RDMA port: attached to one NUMA node of a host and to one fabric switch."""

    host: int
    numa: int  # index into Topology.numa
    name: str  # "mlx5_0"
    switch: int  # fabric node index of the switch it plugs into
    bandwidth: float  # bytes/s
    buffer: float  # bytes of NIC/switch-port buffer that a watermark is a fraction of
    rdma: bool = True


@dataclass(frozen=True, slots=True)
class FabricLink:
    a: int  # fabric node indices
    b: int
    latency: float  # seconds, one way, unloaded
    bandwidth: float  # bytes/s


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # "redis-us-west"
    kind: str  # redis, postgres, http, ...
    role: EndpointRole
    region: str
    node: int  # fabric node index


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU as data, for building matcher instances (`to_deployment`)."""

    host: str
    gpu: str
    gpu_model: str
    numa_node: int
    region: str
    tpm: bool
    memory_encryption: bool
    hardware_firewall: bool
    tee: bool
    session_state: str
    cuda: str

    def to_deployment(self) -> Deployment:
        return Deployment(
            host=self.host, gpu=self.gpu, gpu_model=self.gpu_model, region=self.region,
            numa_node=self.numa_node, tpm=self.tpm, memory_encryption=self.memory_encryption,
            hardware_firewall=self.hardware_firewall, tee=self.tee,
            session_state=self.session_state, cuda=self.cuda,
        )


UPI_LATENCY = 0.2e-6  # crossing sockets on the host (s); small, but it doubles PCIe traffic
PCIE_LATENCY = 1.0e-6


@dataclass(frozen=True, eq=False)
class Topology:
    """The structure, with index arrays the placer evaluates candidates against.

    `ingress` maps a region (or "local") to the fabric node where requests enter.
    """

    version: int
    hosts: tuple[HostInfo, ...]
    numa: tuple[NumaInfo, ...]
    gpus: tuple[GpuInfo, ...]
    ports: tuple[PortInfo, ...]
    fabric_nodes: tuple[str, ...]
    fabric_kinds: tuple[NodeKind, ...]
    links: tuple[FabricLink, ...]
    endpoints: tuple[Endpoint, ...]
    ingress: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, g in enumerate(self.gpus):
            if self.numa[g.numa].host != g.host:
                raise ValueError(f"topology: gpu #{i} ({g.gpu_id}) sits on a NUMA node of another host")
        for p in self.ports:
            if not 0 <= p.switch < len(self.fabric_nodes):
                raise ValueError(f"topology: port `{p.name}` plugs into unknown fabric node #{p.switch}")

    # ------------------------------------------------------------------ lookups

    @cached_property
    def host_index(self) -> dict[str, int]:
        return {h.name: i for i, h in enumerate(self.hosts)}

    @cached_property
    def gpu_index(self) -> dict[tuple[str, str], int]:
        return {(self.hosts[g.host].name, g.gpu_id): i for i, g in enumerate(self.gpus)}

    @cached_property
    def port_index(self) -> dict[str, int]:
        """Ports by `host/port` name."""
        return {f"{self.hosts[p.host].name}/{p.name}": i for i, p in enumerate(self.ports)}

    @cached_property
    def fabric_index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.fabric_nodes)}

    @cached_property
    def endpoint_index(self) -> dict[str, int]:
        return {e.name: i for i, e in enumerate(self.endpoints)}

    @cached_property
    def link_index(self) -> dict[frozenset[str], int]:
        return {frozenset((self.fabric_nodes[l.a], self.fabric_nodes[l.b])): i for i, l in enumerate(self.links)}

    def gpu_key(self, i: int) -> str:
        return self.gpu_keys[i]

    @cached_property
    def gpu_keys(self) -> tuple[str, ...]:
        """`host/gpuN` of every GPU, by index (made once: per-tick work names thousands)."""
        return tuple(f"{self.hosts[g.host].name}/{g.gpu_id}" for g in self.gpus)

    def port_key(self, i: int) -> str:
        p = self.ports[i]
        return f"{self.hosts[p.host].name}/{p.name}"

    # ------------------------------------------------------------------ index arrays

    @cached_property
    def gpu_host(self) -> np.ndarray:
        return _ro(np.array([g.host for g in self.gpus], dtype=np.int64))

    @cached_property
    def gpu_numa(self) -> np.ndarray:
        return _ro(np.array([g.numa for g in self.gpus], dtype=np.int64))

    @cached_property
    def gpu_ports(self) -> tuple[np.ndarray, np.ndarray]:
        """(local, remote): per GPU, the port on its own NUMA node and one on another NUMA
        node of the same host (-1 when absent). Traffic through the remote port crosses
        the socket interconnect: a second path when the local port is congested or down."""
        by_host_numa: dict[tuple[int, int], int] = {}
        by_host: dict[int, list[int]] = {}
        for i, p in enumerate(self.ports):
            by_host_numa.setdefault((p.host, p.numa), i)
            by_host.setdefault(p.host, []).append(i)
        local = np.full(len(self.gpus), -1, dtype=np.int64)
        remote = np.full(len(self.gpus), -1, dtype=np.int64)
        for i, g in enumerate(self.gpus):
            lp = by_host_numa.get((g.host, g.numa), -1)
            local[i] = lp
            for pi in by_host.get(g.host, []):
                if pi != lp and self.ports[pi].numa != g.numa:
                    remote[i] = pi
                    break
            if lp < 0 and remote[i] < 0 and by_host.get(g.host):
                remote[i] = by_host[g.host][0]
        return _ro(local), _ro(remote)

    @cached_property
    def gpu_ingress(self) -> np.ndarray:
        """Per GPU, the fabric node its requests enter at by default: the gateway of its
        host's region (or the first gateway when its region has none)."""
        if not self.ingress:
            return _ro(np.full(len(self.gpus), -1, dtype=np.int64))
        fallback = next(iter(self.ingress.values()))
        return _ro(np.array([self.ingress.get(r, fallback) for r in self.gpu_region], dtype=np.int64))

    @cached_property
    def gpu_models(self) -> tuple[tuple[str, ...], np.ndarray]:
        """(class names, per GPU the index of its class among them)."""
        names = tuple(sorted({g.model for g in self.gpus}))
        at = {m: i for i, m in enumerate(names)}
        return names, _ro(np.array([at[g.model] for g in self.gpus], dtype=np.int64))

    @cached_property
    def gpu_store(self) -> np.ndarray:
        """Per GPU, the kind of session store on its NUMA node (as its string value)."""
        return _ro(np.array([self.numa[g.numa].store.value for g in self.gpus]))

    @cached_property
    def port_switch(self) -> np.ndarray:
        return _ro(np.array([p.switch for p in self.ports], dtype=np.int64))

    @cached_property
    def port_bandwidth(self) -> np.ndarray:
        return _ro(np.array([p.bandwidth for p in self.ports], dtype=np.float64))

    @cached_property
    def port_buffer(self) -> np.ndarray:
        return _ro(np.array([p.buffer for p in self.ports], dtype=np.float64))

    @cached_property
    def gpu_region(self) -> tuple[str, ...]:
        return tuple(self.hosts[g.host].region for g in self.gpus)

    @cached_property
    def link_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b): the fabric node indices of each link's two ends, for the path search."""
        a = np.array([l.a for l in self.links], dtype=np.int64)
        b = np.array([l.b for l in self.links], dtype=np.int64)
        return _ro(a), _ro(b)

    @cached_property
    def fabric_transit(self) -> np.ndarray:
        """Per fabric node: may a path pass through it? Endpoints and ingress gateways are
        where paths start or end, never hops on the way."""
        return _ro(np.array([k not in (NodeKind.ENDPOINT, NodeKind.INGRESS) for k in self.fabric_kinds], dtype=bool))

    @cached_property
    def adjacency(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per fabric node: (neighbour, link index) pairs, for the path search."""
        adj: list[list[tuple[int, int]]] = [[] for _ in self.fabric_nodes]
        for li, l in enumerate(self.links):
            adj[l.a].append((l.b, li))
            adj[l.b].append((l.a, li))
        return tuple(tuple(a) for a in adj)

    # ------------------------------------------------------------------ data views

    def gpu_slots(self) -> tuple[GpuSlot, ...]:
        """Every GPU as data: enough to build a fleet of matcher instances."""
        out = []
        for g in self.gpus:
            h = self.hosts[g.host]
            n = self.numa[g.numa]
            out.append(GpuSlot(
                host=h.name, gpu=g.gpu_id, gpu_model=g.model, numa_node=n.node, region=h.region,
                tpm=h.tpm, memory_encryption=h.memory_encryption, hardware_firewall=h.hardware_firewall,
                tee=h.tee, session_state=n.store.value, cuda=h.cuda,
            ))
        return tuple(out)

    def graph(self) -> nx.Graph:
        """The whole cluster as a networkx graph with static weights (latency seconds,
        bandwidth bytes/s). Node names: host, `host/numaN`, `host/gpuN`, `host/port`,
        switch / ingress / endpoint names."""
        g = nx.Graph()
        for name, k in zip(self.fabric_nodes, self.fabric_kinds):
            g.add_node(name, kind=k.value)
        for l in self.links:
            g.add_edge(self.fabric_nodes[l.a], self.fabric_nodes[l.b], latency=l.latency, bandwidth=l.bandwidth)
        for e in self.endpoints:
            g.nodes[self.fabric_nodes[e.node]].update(service=e.kind, role=e.role.value, region=e.region)
        for h in self.hosts:
            g.add_node(h.name, kind=NodeKind.HOST.value, region=h.region)
        for n in self.numa:
            host = self.hosts[n.host].name
            name = f"{host}/numa{n.node}"
            g.add_node(name, kind=NodeKind.NUMA.value, cpus=len(n.cpus), store=n.store.value)
            g.add_edge(host, name, latency=UPI_LATENCY, bandwidth=64e9)
        for i, gi in enumerate(self.gpus):
            host = self.hosts[gi.host].name
            g.add_node(self.gpu_key(i), kind=NodeKind.GPU.value, model=gi.model)
            g.add_edge(f"{host}/numa{self.numa[gi.numa].node}", self.gpu_key(i), latency=PCIE_LATENCY, bandwidth=64e9)
        for i, p in enumerate(self.ports):
            host = self.hosts[p.host].name
            g.add_node(self.port_key(i), kind=NodeKind.NIC.value, rdma=p.rdma)
            g.add_edge(f"{host}/numa{self.numa[p.numa].node}", self.port_key(i), latency=PCIE_LATENCY, bandwidth=64e9)
            g.add_edge(self.port_key(i), self.fabric_nodes[p.switch], latency=1e-6, bandwidth=p.bandwidth)
        return g


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
