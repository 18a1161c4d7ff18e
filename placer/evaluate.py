"""Evaluate a request's candidate GPUs against one snapshot, all at once.

For each candidate: the share the solver requires, health, free share, PCIe, session
store, both host-local paths (through the port on the GPU's NUMA node, or across the
socket to another port) finished onto the fabric distances the refresher precomputed,
each declared dependency bound to its best endpoint, and the predicted latency with its
spread. Every candidate keeps the *first* constraint it failed, in the order below, so a
refusal can name what bound.

This is the reference: the placer itself gathers the same figures from per-tick tables
(`lookup.py`), and the tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass, ServiceDependency
from policyc.compiler.meaning import MIN_SHARE, compute_seconds, request_flops

from .latency import CROSS_NUMA_PENALTY, gpu_queue, pcie_delay
from .plan import Constraint, DependencyBinding
from .shares import ShareBound
from .snapshot import Snapshot
from .stores import is_local_store, store_table
from .thresholds import Thresholds
from .topology import Endpoint, EndpointRole

ORDER: tuple[Constraint, ...] = (
    Constraint.GPU_CLASS, Constraint.HEALTH, Constraint.GPU_SHARE, Constraint.PCIE, Constraint.SESSION_STORE,
    Constraint.PORT, Constraint.NETWORK, Constraint.DEPENDENCY, Constraint.LATENCY_BUDGET,
)
_CODE = {c: i for i, c in enumerate(ORDER)}
PROXY_ROLE = {"none": EndpointRole.DIRECT, "shared": EndpointRole.SHARED_PROXY, "dedicated": EndpointRole.DEDICATED_PROXY}


@dataclass(frozen=True, eq=False)
class Evaluation:
    gpus: np.ndarray  # topology GPU index per row
    fail: np.ndarray  # index into ORDER, -1 when feasible
    min_share: np.ndarray
    port: np.ndarray  # chosen port per row (-1: none)
    network: np.ndarray
    queueing: np.ndarray
    compute: np.ndarray
    dependencies: np.ndarray
    sigma: np.ndarray
    rank: np.ndarray  # predicted + k * sigma: lower is better
    raw_total: np.ndarray  # prediction ignoring port thresholds (for explaining refusals)
    dep_best: tuple[tuple, ...]  # per declared service: (service, endpoints, best endpoint per row, its latency)

    @property
    def total(self) -> np.ndarray:
        return self.network + self.queueing + self.compute + self.dependencies

    def bindings(self, row: int) -> tuple[DependencyBinding, ...]:
        """The endpoint each declared service binds to for this row (feasible ones only)."""
        out = (binding(svc, eps, int(bi[row]), float(bl[row])) for svc, eps, bi, bl in self.dep_best)
        return tuple(b for b in out if b is not None)

    def dependency_problem(self, row: int) -> str:
        """Why this row's first failing dependency fails ("" when none does)."""
        for svc, eps, bi, bl in self.dep_best:
            role = PROXY_ROLE[svc.proxy].value
            local = is_local_store(svc.kind)
            if not eps:
                return (f"no NUMA node in the topology has a `{svc.kind}` session store for dependency `{svc.name}`"
                        if local else f"no {role} `{svc.kind}` endpoint in the topology for dependency `{svc.name}`")
            if local and not np.isfinite(bl[row]):
                return f"dependency `{svc.name}` is the `{svc.kind}` session store, and this GPU's NUMA node has none"
            if not np.isfinite(bl[row]):
                return f"dependency `{svc.name}` ({svc.kind}): no {role} endpoint is reachable without a congested or failed hop"
            if bl[row] > svc.p99:
                e = eps[int(bi[row])]
                return (f"dependency `{svc.name}` ({svc.kind}, p99 ≤ {svc.p99 * 1e3:g} ms): best {role} endpoint "
                        f"`{e.name}` answers in {bl[row] * 1e3:.1f} ms")
        return ""

    def failed(self, row: int) -> Constraint | None:
        code = int(self.fail[row])
        return None if code < 0 else ORDER[code]

    def constraint(self, row: int) -> Constraint:
        """The constraint a row failed; ValueError for a feasible row."""
        c = self.failed(row)
        if c is None:
            raise ValueError(f"row {row} is feasible: it failed no constraint")
        return c


def binding(svc: ServiceDependency, eps: Sequence[Endpoint], best: int, latency: float) -> DependencyBinding | None:
    """Service `svc` bound to endpoint `eps[best]` at `latency` seconds, or None when no
    endpoint answers within its bound."""
    if eps and latency <= svc.p99:
        e = eps[best]
        return DependencyBinding(svc.name, svc.kind, e.name, e.role.value, latency, svc.p99)
    return None


def evaluate(
    snap: Snapshot, th: Thresholds, gpus: np.ndarray, bounds: dict[str, ShareBound], catalog: dict[str, GpuClass],
    contract: Contract, budget: float, ingress_rows: np.ndarray, reserved: np.ndarray,
) -> Evaluation:
    t, f = snap.topology, snap.frame
    n = len(gpus)
    fail = np.full(n, -1, dtype=np.int64)

    def mark(mask: np.ndarray, c: Constraint) -> None:
        fail[(fail < 0) & mask] = _CODE[c]

    models = [t.gpus[i].model for i in gpus.tolist()]
    sb = [bounds[m] for m in models]
    min_share = np.array([b.min_share for b in sb], dtype=np.float64)
    mark(~np.array([b.feasible for b in sb], dtype=bool), Constraint.GPU_CLASS)
    prec = contract.compute.precision
    peaks = {m: (catalog[m].peak(prec) if m in catalog else None) for m in set(models)}
    peak = np.array([peaks[m] or np.nan for m in models], dtype=np.float64)
    mark(np.isnan(peak), Constraint.GPU_CLASS)

    mark(snap.gpu_health[gpus] < th.min_health, Constraint.HEALTH)
    free = snap.gpu_free[gpus] - reserved
    mark(free < min_share, Constraint.GPU_SHARE)
    pcie = f.gpu_pcie_util[gpus]
    mark(pcie > th.max_pcie_util, Constraint.PCIE)
    sess = contract.session
    if sess is not None and sess.state != "remote" and sess.colocate == "same_numa":
        stores = np.array([t.numa[t.gpus[i].numa].store.value for i in gpus.tolist()])
        mark(stores != sess.state, Constraint.SESSION_STORE)

    share_used = np.clip(np.maximum(free, min_share), MIN_SHARE, 1.0)
    flops = request_flops(contract.compute).hi
    compute = np.where(np.isnan(peak), np.inf,
                       compute_seconds(flops, np.nan_to_num(peak, nan=1.0) * contract.compute.efficiency, share_used))
    queueing = gpu_queue(1.0 - free)
    k = th.stability_weight

    # the two host-local ways onto the fabric, finished onto the precomputed distances
    local, remote = t.gpu_ports
    paths = best_ports(snap, th, local[gpus], remote[gpus], ingress_rows, pcie_delay(pcie))
    best_net, best_var, best_port, raw_net, any_port_ok = paths.net, paths.var, paths.port, paths.raw_net, paths.any_ok
    mark(~any_port_ok, Constraint.PORT)
    mark(~np.isfinite(best_net), Constraint.NETWORK)

    deps = np.zeros(n)
    dep_best: list[tuple[ServiceDependency, Sequence[Endpoint], np.ndarray, np.ndarray]] = []  # (service, endpoints, best index, latency)
    chosen = np.where(best_port >= 0, best_port, 0)
    leaf = t.port_switch[chosen] if len(t.ports) else np.zeros(n, dtype=np.int64)
    for svc in contract.dependencies.services:
        if is_local_store(svc.kind):  # the session store on each GPU's own NUMA node
            st = store_table(t, svc.kind)
            bi, bl = st.best[gpus], st.latency[gpus]
            mark(~(bl <= svc.p99), Constraint.DEPENDENCY)
            deps = deps + np.where(np.isfinite(bl), bl, 0.0)
            dep_best.append((svc, st.endpoints, bi, bl))
            continue
        role = PROXY_ROLE[svc.proxy]
        eps = [e for e in t.endpoints if e.kind == svc.kind and e.role is role]
        if not eps:
            mark(np.ones(n, dtype=bool), Constraint.DEPENDENCY)
            dep_best.append((svc, eps, np.zeros(n, dtype=np.int64), np.full(n, np.inf)))
            continue
        rows = np.array([snap.fabric_rows[e.node] for e in eps])
        p99 = np.array([f.endpoint_p99[t.endpoint_index[e.name]] for e in eps])
        lat = 2.0 * (snap.fabric_dist[rows][:, leaf] + snap.port_delay[chosen]) + p99[:, None]  # E x n
        bi = np.argmin(lat, axis=0)
        bl = lat[bi, np.arange(n)]
        mark(bl > svc.p99, Constraint.DEPENDENCY)
        deps = deps + np.where(np.isfinite(bl), bl, 0.0)
        dep_best.append((svc, eps, bi, bl))

    total = best_net + queueing + compute + deps
    sigma = np.sqrt(best_var + snap.gpu_sigma[gpus] ** 2)
    mark(~(total <= budget * th.budget_fraction), Constraint.LATENCY_BUDGET)
    return Evaluation(
        gpus=gpus, fail=fail, min_share=min_share, port=best_port, network=best_net, queueing=queueing,
        compute=compute, dependencies=deps, sigma=sigma, rank=total + k * sigma,
        raw_total=raw_net + queueing + compute + deps, dep_best=tuple(dep_best),
    )


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
