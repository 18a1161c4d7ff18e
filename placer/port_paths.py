"""Each GPU's best way onto the fabric: through its own NUMA node's RDMA port or, with a
penalty, the other socket's. Read by the port and network signals and by the dependency
signal (the port a GPU's calls leave by), in both runners (`framework.TickInputs.paths`,
`paths.py`), so the reference and the tables cannot drift."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .latency import CROSS_NUMA_PENALTY
from .snapshot import Snapshot
from .thresholds import Thresholds


@dataclass(frozen=True)
class PortPaths:
    """Each GPU's best way onto the fabric (see `best_ports`); arrays aligned with the GPUs."""

    net: np.ndarray  # round-trip network latency through the chosen port (inf: none usable)
    var: np.ndarray  # its variance
    port: np.ndarray  # chosen port index, -1 when none
    raw_net: np.ndarray  # best latency through any port that is up, limits ignored
    any_ok: np.ndarray  # some port within the watermark and utilisation limits


def best_ports(snap: Snapshot, th: Thresholds, local: np.ndarray, remote: np.ndarray, rows: np.ndarray,
               host_pcie: np.ndarray) -> PortPaths:
    """A GPU reaches the fabric through its own NUMA node's port or, with a penalty, the other
    socket's; the better of the two by predicted latency + k·σ wins, and a port over the
    watermark or utilisation limit is skipped. Shared by the per-request reference evaluation
    and the per-tick path tables, so the two cannot drift."""
    t, f = snap.topology, snap.frame
    n = len(local)
    k = th.stability_weight
    best_net = np.full(n, np.inf)
    best_var = np.zeros(n)
    best_port = np.full(n, -1, dtype=np.int64)
    best_rank = np.full(n, np.inf)
    raw_net = np.full(n, np.inf)
    any_port_ok = np.zeros(n, dtype=bool)
    for ports, extra in ((local, 0.0), (remote, CROSS_NUMA_PENALTY)):
        valid = ports >= 0
        if not valid.any():
            continue
        pp = np.where(valid, ports, 0)
        up = valid & f.port_up[pp]
        ok = up & (f.port_watermark[pp] <= th.max_port_watermark) & (f.port_util[pp] <= th.max_port_util)
        any_port_ok |= ok
        leaf = t.port_switch[pp]
        d = snap.fabric_dist[rows, leaf]
        v = snap.fabric_var[rows, leaf]
        net = 2.0 * (d + snap.port_delay[pp] + host_pcie + extra)
        var = 2.0 * (v + snap.port_sigma[pp] ** 2)
        raw_net = np.where(up, np.minimum(raw_net, net), raw_net)
        r = np.where(ok, net + k * np.sqrt(var), np.inf)
        better = r < best_rank
        best_rank = np.where(better, r, best_rank)
        best_net = np.where(better, net, best_net)
        best_var = np.where(better, var, best_var)
        best_port = np.where(better, ports, best_port)
    return PortPaths(best_net, best_var, best_port, raw_net, any_port_ok)


__all__ = ["PortPaths", "best_ports"]
