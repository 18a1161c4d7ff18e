"""What a plan states about a GPU and the port it is reached through, per snapshot.

Where the GPU is (host, NUMA node, its CPUs), the RDMA port's name, the queue depth sized
for the port's bandwidth-delay product, and the probes its state calls for depend on the
snapshot and the (GPU, port) pair alone, not on the request. A busy tick places hundreds
of requests on a few dozen such pairs, so each pair is worked out once per snapshot.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .snapshot import Snapshot

MSG_BYTES = 4096  # RDMA message size the queue depth is sized for


class Site(NamedTuple):
    host: str
    gpu: str
    model: str
    numa_node: int
    cpus: tuple[int, ...]
    rdma_port: str | None
    queue_depth: int
    probes: tuple[str, ...]  # before the request's own (dependencies, staleness)


def site(snap: Snapshot, g: int, port: int) -> Site:
    """GPU `g` reached through `port` (-1: none) on this snapshot."""
    t, f = snap.topology, snap.frame
    gi = t.gpus[g]
    numa = t.numa[gi.numa]
    wm = float(f.port_watermark[port]) if port >= 0 else 0.0
    depth = 16
    if port >= 0:
        rtt = 2.0 * (float(snap.port_delay[port]) + 50e-6)
        inflight = t.ports[port].bandwidth * (1.0 - float(f.port_util[port])) * rtt / MSG_BYTES * (1.0 - wm)
        depth = int(min(1024, max(16, 2 ** math.ceil(math.log2(max(inflight, 1.0))))))
    probes = ["gpu_sm_util", "e2e_latency"]
    if port >= 0 and wm > 0.5 * snap.thresholds.max_port_watermark:
        probes.append(f"rdma_watermark:{t.port_key(port)}")
    if float(f.gpu_pcie_util[g]) > 0.5 * snap.thresholds.max_pcie_util:
        probes.append("pcie_util")
    return Site(t.hosts[gi.host].name, gi.gpu_id, gi.model, numa.node, numa.cpus,
                t.port_key(port) if port >= 0 else None, depth, tuple(probes))


class Sites:
    """`get(snap, g, port)`: the `Site`, worked out once per snapshot."""

    def __init__(self) -> None:
        self._memo: tuple[Snapshot | None, dict[tuple[int, int], Site]] = (None, {})

    def get(self, snap: Snapshot, g: int, port: int) -> Site:
        owner, memo = self._memo
        if owner is not snap:
            memo = {}
            self._memo = (snap, memo)  # one assignment: a racing reader sees the old pair or the new one
        hit = memo.get((g, port))
        if hit is None:
            hit = memo[(g, port)] = site(snap, g, port)
        return hit


__all__ = ["MSG_BYTES", "Site", "Sites", "site"]
