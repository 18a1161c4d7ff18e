"""Dependencies: each service the contract declares is bound to its best endpoint of the
declared kind and proxy role (the round trip from the GPU's chosen port plus the
endpoint's p99), or to the session store on the GPU's own NUMA node for a store kind; a GPU
whose best binding of some service is over that service's p99 bound is refused. The
bindings' latencies add up to the prediction's `dependencies` term.

A `TICK_CONTRACT` signal: the reference binds per request over the candidates; the tables
read the path table's per-(kind, role) dependency tables (`paths.DependencyTable`), built
once per tick for every GPU. `extra` carries the bindings: per service, (service,
endpoints, best endpoint per GPU, its latency)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from policyc.compiler.bundle import ServiceDependency

from ..framework import NOTHING, Column, Signal, Stage, TickContractInputs, Words
from ..plan import Constraint, DependencyBinding
from ..stores import is_local_store, measured_latency, store_table
from ..topology import Endpoint, EndpointRole

PROXY_ROLE = {"none": EndpointRole.DIRECT, "shared": EndpointRole.SHARED_PROXY, "dedicated": EndpointRole.DEDICATED_PROXY}
Bound = tuple[ServiceDependency, Sequence[Endpoint], np.ndarray, np.ndarray]  # (service, endpoints, best, latency)


class Dependency(Signal[TickContractInputs]):
    name = "dependency"
    constraint = Constraint.DEPENDENCY
    consumes = ("endpoint_p99",)
    stage = Stage.TICK_CONTRACT

    def reference(self, x: TickContractInputs) -> Column:
        assert x.tick is not None, "the reference binds over the candidates' paths"
        if not x.contract.dependencies.services:
            return NOTHING
        snap, tx = x.snap, x.tick
        t, f = snap.topology, snap.frame
        gpus = np.arange(len(t.gpus))[tx.gpus]
        n = len(gpus)
        fail = np.zeros(n, dtype=bool)
        deps = np.zeros(n)
        bound: list[Bound] = []
        best_port = tx.paths.port
        chosen = np.where(best_port >= 0, best_port, 0)
        leaf = t.port_switch[chosen] if len(t.ports) else np.zeros(n, dtype=np.int64)
        for svc in x.contract.dependencies.services:
            if is_local_store(svc.kind):  # the session store on each GPU's own NUMA node
                st = store_table(t, svc.kind)
                bi, bl = st.best[gpus], measured_latency(st, svc.kind, f.measured)[gpus]
                fail |= ~(bl <= svc.p99)
                deps = deps + np.where(np.isfinite(bl), bl, 0.0)
                bound.append((svc, st.endpoints, bi, bl))
                continue
            role = PROXY_ROLE[svc.proxy]
            eps = [e for e in t.endpoints if e.kind == svc.kind and e.role is role]
            if not eps:
                fail[:] = True
                bound.append((svc, eps, np.zeros(n, dtype=np.int64), np.full(n, np.inf)))
                continue
            rows = np.array([snap.fabric_rows[e.node] for e in eps])
            p99 = np.array([f.endpoint_p99[t.endpoint_index[e.name]] for e in eps])
            lat = 2.0 * (snap.fabric_dist[rows][:, leaf] + snap.port_delay[chosen]) + p99[:, None]  # E x n
            bi = np.argmin(lat, axis=0)
            bl = lat[bi, np.arange(n)]
            fail |= bl > svc.p99
            deps = deps + np.where(np.isfinite(bl), bl, 0.0)
            bound.append((svc, eps, bi, bl))
        return Column(fail=fail, latency=deps, extra=tuple(bound))

    def column(self, x: TickContractInputs) -> Column:
        """From the path table's dependency tables (every GPU, built once per tick and kind)."""
        pt = x.table
        assert pt is not None, "the tables' runner passes the tick's path table"
        if not x.contract.dependencies.services:
            return NOTHING
        n = len(x.snap.topology.gpus)
        fail: np.ndarray | None = None
        deps = np.zeros(n)
        bound: list[Bound] = []
        for svc in x.contract.dependencies.services:
            dt = pt.dependency(x.snap, svc.kind, PROXY_ROLE[svc.proxy])
            if not dt.endpoints:
                over = np.ones(n, dtype=bool)
            else:
                over = dt.latency > svc.p99
                deps = deps + np.where(np.isfinite(dt.latency), dt.latency, 0.0)
            fail = over if fail is None else fail | over
            bound.append((svc, dt.endpoints, dt.best, dt.latency))
        return Column(fail=fail, latency=deps, extra=tuple(bound))

    def detail(self, w: Words, r: int) -> str:
        return problem(w.ev.dep_best, r)


def binding(svc: ServiceDependency, eps: Sequence[Endpoint], best: int, latency: float) -> DependencyBinding | None:
    """Service `svc` bound to endpoint `eps[best]` at `latency` seconds, or None when no
    endpoint answers within its bound."""
    if eps and latency <= svc.p99:
        e = eps[best]
        return DependencyBinding(svc.name, svc.kind, e.name, e.role.value, latency, svc.p99)
    return None


def problem(bound: Sequence[Bound], row: int) -> str:
    """Why `row`'s first failing dependency fails ("" when none does)."""
    for svc, eps, bi, bl in bound:
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
