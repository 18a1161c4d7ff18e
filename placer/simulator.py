"""A deterministic simulated cluster: the embedded telemetry source for demos and tests.

Given a seed, the same hosts, regions, security facts, GPU classes, session stores and
noise appear every run, so a test can script "port X climbs to 89 % on tick 3" and know
what the placer will see. Structure: per region, racks of hosts under two leaf switches
(each host's NIC on NUMA node n plugs into leaf a or b), leaves meshed to the region's
spines, spines to a pair of core routers, one ingress gateway per region and service
endpoints (Redis direct, a shared proxy, a dedicated cache proxy, Postgres, an HTTP API
tier) behind a services leaf. Session stores (NVMe, host memory) sit on NUMA nodes and are
reached without the fabric (`stores.py`). Telemetry follows mean-reverting random walks around per-entity baselines.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from .catalog import DEFAULT_CATALOG, catalog_by_name
from .events import Event, EventKind
from .telemetry import TelemetryFrame
from .topology import (
    Endpoint, EndpointRole, FabricLink, GpuInfo, GpuSlot, HostInfo, NodeKind, NumaInfo, PortInfo,
    StoreKind, Topology,
)

REGIONS: tuple[str, ...] = ("us-west", "us-east", "eu-west", "eu-central")
GPU_MIX: tuple[tuple[str, float], ...] = (
    ("H100", 0.30), ("A100-80G", 0.25), ("A100-40G", 0.15), ("H200", 0.10), ("L40S", 0.10), ("L4", 0.10),
)
_PORT_BW = 12.5e9  # 100 Gb/s
_PORT_BUFFER = 32e6  # bytes
_INGRESS_LATENCY = 4e-3  # load balancer + TLS termination, one way
_SPINE_LEAF_LATENCY = 20e-6
_CORE_LATENCY = 15e-3  # inter-region
_ENDPOINT_LATENCY = 50e-6
# (kind, role, baseline p99 seconds)
_SERVICES: tuple[tuple[str, EndpointRole, float], ...] = (
    ("redis", EndpointRole.DIRECT, 2.0e-3),
    ("redis", EndpointRole.SHARED_PROXY, 1.5e-3),
    ("redis", EndpointRole.DEDICATED_PROXY, 0.6e-3),
    ("postgres", EndpointRole.DIRECT, 8.0e-3),
    ("http", EndpointRole.DIRECT, 12.0e-3),  # a regional HTTP API tier (catalog, feature services)
)
_ROLE_PREFIX = {EndpointRole.DIRECT: "", EndpointRole.SHARED_PROXY: "proxy-", EndpointRole.DEDICATED_PROXY: "cacheproxy-"}


def simulated_addresses(h: int) -> tuple[str, ...]:
    """Host `h`'s addresses: its own in 198.18.0.0/15 (RFC 2544's range for test networks,
    never routed) and loopback, since the simulated cluster runs on this machine: a real
    model server registered on a simulated host (the demo's) answers on loopback."""
    return (f"198.18.{h >> 8 & 0xFF}.{h & 0xFF}" if h < 1 << 16 else f"198.19.{h >> 8 & 0xFF}.{h & 0xFF}",
            "127.0.0.1", "::1")


class SimulatedCluster:
    """`SimulatedCluster(seed, hosts, gpus_per_host=8)`; a `TelemetrySource`."""

    name = "simulated"

    def __init__(
        self, seed: int, hosts: int, gpus_per_host: int = 8, *, numa_per_host: int = 2,
        cpus_per_numa: int = 32, hosts_per_rack: int = 32, spines_per_region: int = 4,
        regions: tuple[str, ...] = REGIONS, noise: float = 1.0,
    ) -> None:
        if hosts < 1 or gpus_per_host < 1 or numa_per_host < 1 or hosts_per_rack < 1 or spines_per_region < 1:
            raise ValueError("simulated cluster: hosts, gpus_per_host, numa_per_host, hosts_per_rack and spines_per_region must be at least 1")
        if not regions:
            raise ValueError("simulated cluster: at least one region is needed")
        self.seed = seed
        self._noise = noise
        rng = np.random.default_rng(seed)
        self._topology = _build(rng, hosts, gpus_per_host, numa_per_host, cpus_per_numa, hosts_per_rack, spines_per_region, regions)
        self._rng = np.random.default_rng([seed, 1])
        t = self._topology
        cat = catalog_by_name(DEFAULT_CATALOG)
        self._gpu_mem = np.array([cat[g.model].memory for g in t.gpus])
        # per-entity baselines and current values of the random walks
        self._gpu_base = rng.beta(2.0, 3.5, len(t.gpus))
        self._port_base = rng.beta(1.5, 9.0, len(t.ports))
        self._link_base = rng.beta(2.0, 8.0, len(t.links))
        self._sw_base = np.where(
            np.isin(np.array(list(t.fabric_kinds)), [NodeKind.LEAF, NodeKind.SPINE, NodeKind.CORE]),
            rng.beta(1.5, 12.0, len(t.fabric_nodes)), 0.0,
        )
        self._ep_base = np.array([_base_p99(e) for e in t.endpoints])
        self._gpu = self._gpu_base.copy()
        self._port = self._port_base.copy()
        self._link = self._link_base.copy()
        self._sw = self._sw_base.copy()
        self._tick = 0
        self._pending: list[Event] = []
        self._scheduled: dict[int, list[Event]] = defaultdict(list)
        # pinned values: (kind, index) -> (value, expires at tick or None)
        self._pins: dict[tuple[EventKind, int], tuple[float, int | None]] = {}
        self._occupied: np.ndarray = np.zeros(len(t.gpus))
        self._occupy_until: list[tuple[int, int, float]] = []  # (expires, gpu, share)
        self._links_down: set[int] = set()
        self._ports_down: set[int] = set()

    # ------------------------------------------------------------------ TelemetrySource

    def topology(self) -> Topology:
        return self._topology

    def gpu_slots(self) -> tuple[GpuSlot, ...]:
        """Every GPU slot as data (host, gpu id, class, NUMA node, region, security facts,
        session store kind): what a fleet of matcher instances is built from."""
        return self._topology.gpu_slots()

    @property
    def tick(self) -> int:
        return self._tick

    def sample(self) -> TelemetryFrame:
        """Advance one tick: apply due events, step the random walks, report."""
        self._tick += 1
        tick = self._tick
        for ev in self._scheduled.pop(tick, []) + self._pending:
            self._apply(ev, tick)
        self._pending = []
        self._expire(tick)
        rng, s = self._rng, self._noise
        t = self._topology
        self._gpu = np.clip(self._gpu_base + 0.8 * (self._gpu - self._gpu_base) + 0.035 * s * rng.standard_normal(len(t.gpus)), 0.0, 0.97)
        self._port = np.clip(self._port_base + 0.7 * (self._port - self._port_base) + 0.03 * s * rng.standard_normal(len(t.ports)), 0.0, 0.99)
        self._link = np.clip(self._link_base + 0.7 * (self._link - self._link_base) + 0.03 * s * rng.standard_normal(len(t.links)), 0.0, 0.99)
        sw_noise = 0.02 * s * rng.standard_normal(len(t.fabric_nodes))
        self._sw = np.where(self._sw_base > 0, np.clip(self._sw_base + 0.7 * (self._sw - self._sw_base) + sw_noise, 0.0, 0.99), 0.0)
        ep_noise = np.exp(0.08 * s * rng.standard_normal(len(t.endpoints)))

        demand = np.clip(self._gpu + self._occupied, 0.0, 1.0)
        sm = demand.copy()
        health = np.ones(len(t.gpus))
        port_wm = self._port.copy()
        port_util = np.clip(self._port * 0.9 + 0.05, 0.0, 1.0)
        sw = self._sw.copy()
        p99 = self._ep_base * ep_noise
        for (kind, i), (value, _) in self._pins.items():
            if kind is EventKind.SM_COLLAPSE:
                demand[i] = max(demand[i], 0.6)  # stuck work piles up while SMs idle
                sm[i] = value
            elif kind is EventKind.WATERMARK and i < len(t.ports):  # a switch is offset past the ports
                port_wm[i] = value
                port_util[i] = max(port_util[i], value)
            elif kind is EventKind.SERVICE_P99:
                p99[i] = value
            elif kind is EventKind.GPU_HEALTH:
                health[i] = value
        for (kind, i), (value, _) in self._pins.items():
            if kind is EventKind.WATERMARK and i >= len(t.ports):  # a switch, offset past ports
                sw[i - len(t.ports)] = value
        port_up = np.ones(len(t.ports), dtype=bool)
        port_up[list(self._ports_down)] = False
        link_up = np.ones(len(t.links), dtype=bool)
        link_up[list(self._links_down)] = False
        return TelemetryFrame(
            tick=tick, gpu_sm_util=sm, gpu_demand=demand, gpu_mem_free=self._gpu_mem * (1.0 - 0.8 * demand),
            gpu_pcie_util=np.clip(0.35 * demand + 0.02 * s * rng.standard_normal(len(t.gpus)), 0.0, 1.0),
            gpu_health=health, port_watermark=port_wm, port_util=port_util, port_up=port_up,
            link_util=self._link.copy(), link_up=link_up, switch_watermark=sw, endpoint_p99=p99,
            numa_mem_free=np.full(len(t.numa), 256e9) * (1.0 - 0.5 * np.bincount(t.gpu_numa, weights=demand, minlength=len(t.numa)) / np.maximum(np.bincount(t.gpu_numa, minlength=len(t.numa)), 1)),
        )

    # ------------------------------------------------------------------ scripted events

    def watermark(self, port: str, value: float, ticks: int | None = None) -> Event:
        """Pin an RDMA port's (`host/mlx5_0`) or a switch's buffer watermark."""
        return self.submit(Event(EventKind.WATERMARK, port, _fraction(value, "watermark"), ticks))

    def sm_collapse(self, gpu: str, value: float = 0.15, ticks: int | None = None) -> Event:
        """A GPU (`host/gpu3`) whose SM utilisation collapses to `value` while work piles up."""
        return self.submit(Event(EventKind.SM_COLLAPSE, gpu, _fraction(value, "SM utilisation"), ticks))

    def link_down(self, a: str, b: str | None = None, ticks: int | None = None) -> Event:
        """Fail an RDMA port (`link_down("host/mlx5_0")`) or a fabric link (`link_down(leaf, spine)`)."""
        return self.submit(Event(EventKind.LINK_DOWN, a if b is None else f"{a}|{b}", 0.0, ticks))

    def link_up(self, a: str, b: str | None = None) -> Event:
        return self.submit(Event(EventKind.LINK_UP, a if b is None else f"{a}|{b}"))

    def service_p99(self, endpoint: str, seconds: float, ticks: int | None = None) -> Event:
        """Pin a service endpoint's p99 latency (seconds), e.g. `service_p99("redis-us-west", 0.8)`."""
        if not seconds >= 0:
            raise ValueError(f"service_p99: latency must be a non-negative number of seconds, got {seconds!r}")
        return self.submit(Event(EventKind.SERVICE_P99, endpoint, float(seconds), ticks))

    def gpu_health(self, gpu: str, value: float, ticks: int | None = None) -> Event:
        return self.submit(Event(EventKind.GPU_HEALTH, gpu, _fraction(value, "health"), ticks))

    def occupy(self, gpu: str, share: float, ticks: int = 1) -> Event:
        """Add demand on a GPU for some ticks: work dispatched there shows in its telemetry."""
        return self.submit(Event(EventKind.OCCUPY, gpu, _fraction(share, "share"), ticks))

    def clear(self, target: str) -> Event:
        return self.submit(Event(EventKind.CLEAR, target))

    def submit(self, event: Event, at_tick: int | None = None) -> Event:
        """Queue an event for the next tick (or for tick `at_tick`). The target is checked now
        so that a misspelt name fails where it was written."""
        self._resolve(event)
        if at_tick is None or at_tick <= self._tick:
            self._pending.append(event)
        else:
            self._scheduled[at_tick].append(event)
        return event

    # ------------------------------------------------------------------ internals

    def _resolve(self, ev: Event) -> tuple[str, int]:
        t = self._topology
        k, target = ev.kind, ev.target
        if k in (EventKind.SM_COLLAPSE, EventKind.GPU_HEALTH, EventKind.OCCUPY):
            host, _, gpu = target.rpartition("/")
            i = t.gpu_index.get((host, gpu))
            if i is None:
                raise ValueError(f"{k.value}: unknown GPU `{target}` (expected `host/gpuN`, e.g. `{t.gpu_key(0)}`)")
            return "gpu", i
        if k is EventKind.SERVICE_P99:
            i = t.endpoint_index.get(target)
            if i is None:
                raise ValueError(f"service_p99: unknown endpoint `{target}` (known: {', '.join(e.name for e in t.endpoints[:6])}, ...)")
            return "endpoint", i
        if "|" in target:
            a, _, b = target.partition("|")
            i = t.link_index.get(frozenset((a, b)))
            if i is None:
                raise ValueError(f"{k.value}: no fabric link between `{a}` and `{b}`")
            return "link", i
        if target in t.port_index:
            return "port", t.port_index[target]
        if target in t.fabric_index and k in (EventKind.WATERMARK, EventKind.CLEAR):
            return "switch", t.fabric_index[target]
        if k is EventKind.CLEAR and (target.rpartition("/")[0], target.rpartition("/")[2]) in t.gpu_index:
            return "gpu", t.gpu_index[(target.rpartition("/")[0], target.rpartition("/")[2])]
        if k is EventKind.CLEAR and target in t.endpoint_index:
            return "endpoint", t.endpoint_index[target]
        raise ValueError(f"{k.value}: unknown target `{target}` (expected a port such as `{t.port_key(0)}`, a switch, or `a|b` for a link)")

    def _apply(self, ev: Event, tick: int) -> None:
        what, i = self._resolve(ev)
        until = None if ev.ticks is None else tick + ev.ticks
        k = ev.kind
        if k is EventKind.OCCUPY:
            self._occupied[i] += ev.value
            self._occupy_until.append((tick + (ev.ticks or 1), i, ev.value))
        elif k is EventKind.LINK_DOWN:
            (self._links_down if what == "link" else self._ports_down).add(i)
            if until is not None:
                self._pins[(EventKind.LINK_UP, i if what == "link" else -1 - i)] = (0.0, until)
        elif k is EventKind.LINK_UP:
            (self._links_down if what == "link" else self._ports_down).discard(i)
        elif k is EventKind.CLEAR:
            offset = len(self._topology.ports) if what == "switch" else 0
            for key in [key for key in self._pins if key[1] == i + offset]:
                del self._pins[key]
            if what == "link":
                self._links_down.discard(i)
            if what == "port":
                self._ports_down.discard(i)
        else:
            offset = len(self._topology.ports) if what == "switch" else 0
            self._pins[(k, i + offset)] = (ev.value, until)

    def _expire(self, tick: int) -> None:
        for key, (_, until) in list(self._pins.items()):
            if until is not None and until <= tick:
                del self._pins[key]
                if key[0] is EventKind.LINK_UP:  # a timed link failure ends
                    i = key[1]
                    if i >= 0:
                        self._links_down.discard(i)
                    else:
                        self._ports_down.discard(-1 - i)
        keep = []
        for until, i, share in self._occupy_until:
            if until <= tick:
                self._occupied[i] = max(0.0, self._occupied[i] - share)
            else:
                keep.append((until, i, share))
        self._occupy_until = keep


def _fraction(v: float, what: str) -> float:
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{what} must be a fraction in [0, 1], got {v!r}")
    return float(v)


def _base_p99(e: Endpoint) -> float:
    for kind, role, p99 in _SERVICES:
        if kind == e.kind and role is e.role:
            return p99
    return 5e-3


def _build(
    rng: np.random.Generator, n_hosts: int, gpus_per_host: int, numa_per_host: int, cpus_per_numa: int,
    hosts_per_rack: int, spines_per_region: int, regions: tuple[str, ...],
) -> Topology:
    fabric: list[str] = []
    kinds: list[NodeKind] = []
    links: list[FabricLink] = []

    def node(name: str, kind: NodeKind) -> int:
        fabric.append(name)
        kinds.append(kind)
        return len(fabric) - 1

    n_racks = math.ceil(n_hosts / hosts_per_rack)
    used_regions = regions[: min(len(regions), n_racks)]
    cores = [node(f"core-{i}", NodeKind.CORE) for i in range(2)]
    spines: dict[str, list[int]] = {}
    ingress: dict[str, int] = {}
    endpoints: list[Endpoint] = []
    for r in used_regions:
        spines[r] = [node(f"{r}/spine-{i}", NodeKind.SPINE) for i in range(spines_per_region)]
        for s in spines[r]:
            for c in cores:
                links.append(FabricLink(s, c, _CORE_LATENCY, 50e9))
        ingress[r] = node(f"ingress/{r}", NodeKind.INGRESS)
        svc_leaf = node(f"{r}/leaf-svc", NodeKind.LEAF)
        for s in spines[r]:
            links.append(FabricLink(ingress[r], s, _INGRESS_LATENCY, 50e9))
            links.append(FabricLink(svc_leaf, s, _SPINE_LEAF_LATENCY, 50e9))
        for kind, role, _ in _SERVICES:
            e = node(f"{_ROLE_PREFIX[role]}{kind}-{r}", NodeKind.ENDPOINT)
            links.append(FabricLink(e, svc_leaf, _ENDPOINT_LATENCY, _PORT_BW))
            endpoints.append(Endpoint(fabric[e], kind, role, r, e))

    models = [m for m, _ in GPU_MIX]
    weights = np.array([w for _, w in GPU_MIX])
    stores = [StoreKind.NVME, StoreKind.HOST_MEMORY, StoreKind.REMOTE]
    hosts: list[HostInfo] = []
    numa: list[NumaInfo] = []
    gpus: list[GpuInfo] = []
    ports: list[PortInfo] = []
    for rack in range(n_racks):
        region = used_regions[rack % len(used_regions)]
        leaves = [node(f"{region}/rack-{rack:03d}/leaf-{x}", NodeKind.LEAF) for x in "ab"]
        for lf in leaves:
            for s in spines[region]:
                links.append(FabricLink(lf, s, _SPINE_LEAF_LATENCY, 50e9))
        for h in range(rack * hosts_per_rack, min(n_hosts, (rack + 1) * hosts_per_rack)):
            tee = bool(rng.random() < 0.2)
            hosts.append(HostInfo(
                name=f"host-{h:04d}", region=region, tpm=bool(rng.random() < 0.8),
                memory_encryption=tee or bool(rng.random() < 0.45), hardware_firewall=bool(rng.random() < 0.4), tee=tee,
                cuda=("12.4", "12.2", "11.8")[int(rng.choice(3, p=[0.7, 0.2, 0.1]))],
                addresses=simulated_addresses(h),
            ))
            hi = len(hosts) - 1
            model = models[int(rng.choice(len(models), p=weights))]
            first_numa = len(numa)
            for n in range(numa_per_host):
                store = stores[int(rng.choice(3, p=[0.5, 0.3, 0.2]))]
                numa.append(NumaInfo(hi, n, tuple(range(n * cpus_per_numa, (n + 1) * cpus_per_numa)), store))
                ports.append(PortInfo(hi, first_numa + n, f"mlx5_{n}", leaves[n % 2], _PORT_BW, _PORT_BUFFER))
            for g in range(gpus_per_host):
                gpus.append(GpuInfo(hi, first_numa + g * numa_per_host // gpus_per_host, f"gpu{g}", model))
    return Topology(
        version=1, hosts=tuple(hosts), numa=tuple(numa), gpus=tuple(gpus), ports=tuple(ports),
        fabric_nodes=tuple(fabric), fabric_kinds=tuple(kinds), links=tuple(links), endpoints=tuple(endpoints),
        ingress=ingress,
    )
