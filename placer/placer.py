"""Contract-aware placement: choose the GPU for one request, say why, never raise.

The placer keeps three small pieces of state between requests:
- reservations made on the current snapshot (so a burst within one tick spreads instead
  of piling onto the GPU that looked best when the tick began);
- sticky choices per affinity key (hysteresis: the previous GPU stays while it is feasible
  and within a margin of the best, so placements do not flap between ticks);
- sessions: a session stays on its GPU (next to its state store) until that placement
  becomes infeasible; a move prefers the same NUMA node, then the same host, and is
  reported in the plan.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from policyc.compiler.bundle import Contract, GpuClass
from policyc.matcher.instance import Instance

from .candidate_rows import CandidateRows
from .catalog import DEFAULT_CATALOG
from .contract_table import ContractTable, contract_table
from .evaluate import ORDER, Evaluation
from .lookup import lookup
from .plan import (
    Constraint, Explanation, LatencyBreakdown, NoPlacement, PlacementPlan, RebalanceReport, Rejection, SessionMove,
    ShareSource,
)
from .snapshot import Snapshot
from .thresholds import Thresholds

MAX_REJECTIONS = 20
MAX_REJECTIONS_IN_PLAN = 8  # a plan lists a few; a refusal lists more, binding constraint first
MSG_BYTES = 4096  # RDMA message size the queue depth is sized for
SCALAR_MAX = 32  # up to this many candidates, choose among them on Python lists (numpy's per-call overhead dominates)


def _feasible_and_best(ev: Evaluation) -> tuple[np.ndarray, int]:
    """The feasible rows and the best-ranked of them (-1 when none): np.argmin's choice,
    the first minimum, with NaN winning as it does there. A handful of candidates are
    scanned as Python lists, which costs less than the four numpy calls it replaces."""
    if len(ev.fail) > SCALAR_MAX:
        feasible = np.flatnonzero(ev.fail < 0)
        return feasible, (int(feasible[np.argmin(ev.rank[feasible])]) if len(feasible) else -1)
    feas = [i for i, code in enumerate(ev.fail.tolist()) if code < 0]
    best = -1
    if feas:
        rank = ev.rank.tolist()
        nan = [i for i in feas if rank[i] != rank[i]]
        best = nan[0] if nan else min(feas, key=rank.__getitem__)
    return np.array(feas, dtype=np.int64), best


def _first_row_on(ev: Evaluation, feasible: np.ndarray, gpu: int) -> int:
    """The first feasible row on topology GPU `gpu`, or -1."""
    if len(feasible) > SCALAR_MAX:
        hit = np.flatnonzero(ev.gpus[feasible] == gpu)
        return int(feasible[hit[0]]) if len(hit) else -1
    gpus = ev.gpus.tolist()
    return next((r for r in feasible.tolist() if gpus[r] == gpu), -1)


class SnapshotProvider(Protocol):
    def current(self) -> Snapshot: ...

    def report_anomaly(self, host: str, gpu: str, signal: str, value: float) -> bool: ...


class Placer:
    """`Placer(refresher)`: `place(...)`, `report_anomaly(...)`, `rebalance(host)`."""

    def __init__(
        self, snapshots: SnapshotProvider, catalog: Iterable[GpuClass] = DEFAULT_CATALOG, *,
        hysteresis: float = 0.05, hysteresis_abs: float = 2e-3, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._snapshots = snapshots
        self._catalog = {g.name: g for g in catalog}
        self._hyst = hysteresis
        self._hyst_abs = hysteresis_abs
        self._clock = clock
        self._lock = threading.Lock()
        self._reserved = np.zeros(0)  # share reserved per GPU on the current snapshot
        self._reserved_version = -1
        self._sticky: dict[str, int] = {}
        self._sessions: dict[str, int] = {}
        self._tables: dict[tuple, ContractTable] = {}
        self._rows = CandidateRows()

    # ------------------------------------------------------------------ public API

    def place(
        self, candidates: Sequence[Instance], budget: float, contract: Contract, session: str | None = None, *,
        ingress: str | None = None, affinity_key: str | None = None,
    ) -> PlacementPlan | NoPlacement:
        """Choose a GPU among `candidates` for one request with `budget` seconds end to end.

        `ingress` names the fabric node the request enters at (default: the gateway of each
        candidate's region). `affinity_key` groups requests for hysteresis (default: the
        contract name and ingress). Never raises: every failure is a `NoPlacement`.
        """
        snap: Snapshot | None = None
        try:
            snap = self._snapshots.current()
            return self._place(snap, candidates, budget, contract, session, ingress, affinity_key)
        except Exception as e:  # the contract is "never raises": a bug becomes a refusal that says so
            return NoPlacement(Constraint.INTERNAL, f"placer error: {type(e).__name__}: {e}", False,
                               snap.version if snap is not None else -1)

    def report_anomaly(self, gpu: str | tuple[str, str], signal: str, value: float) -> bool:
        """Lower a GPU's health (`host/gpuN` or (host, gpu)); visible on the next tick."""
        host, g = gpu if isinstance(gpu, tuple) else (gpu.rpartition("/")[0], gpu.rpartition("/")[2])
        return self._snapshots.report_anomaly(host, g, signal, value)

    def rebalance(self, host: str) -> RebalanceReport:
        """Self-heal: release every session and sticky placement on `host`, so the next
        request of each is placed afresh (and a session's move is reported then)."""
        snap = self._snapshots.current()
        t = snap.topology
        hi = t.host_index.get(host)
        with self._lock:
            if hi is None:
                return RebalanceReport(host, (), 0)
            on_host = lambda g: t.gpus[g].host == hi  # noqa: E731
            sessions = tuple(sorted(s for s, g in self._sessions.items() if on_host(g)))
            for s in sessions:
                del self._sessions[s]
            keys = [k for k, g in self._sticky.items() if on_host(g)]
            for k in keys:
                del self._sticky[k]
        return RebalanceReport(host, sessions, len(keys))

    def session_gpu(self, session: str) -> str | None:
        g = self._sessions.get(session)
        return None if g is None else self._snapshots.current().topology.gpu_key(g)

    # ------------------------------------------------------------------ internals

    def _contract_table(self, contract: Contract, topology, budget: float) -> ContractTable:
        """The contract's table for this topology, cached per contract object (and per
        budget when the contract has no SLO, since the budget then sets the share window)."""
        key = (id(contract), None if contract.slo is not None else budget)
        hit = self._tables.get(key)
        if hit is None or hit.contract is not contract or hit.topology is not topology:
            if len(self._tables) > 256:
                self._tables.clear()
            hit = self._tables[key] = contract_table(contract, topology, self._catalog, budget)
        return hit

    def _place(
        self, snap: Snapshot, candidates: Sequence[Instance], budget: float, contract: Contract, session: str | None,
        ingress: str | None, affinity_key: str | None,
    ) -> PlacementPlan | NoPlacement:
        t = snap.topology
        now = self._clock()
        stale = snap.is_stale(now)
        th = snap.thresholds.conservative() if stale else snap.thresholds
        reasons: list[str] = []
        if stale:
            reasons.append(f"snapshot {snap.version} is stale ({snap.age(now) * 1e3:.0f} ms old, limit "
                           f"{2 * snap.interval * 1e3:.0f} ms): conservative limits (port watermark ≤ {th.max_port_watermark:.0%}, "
                           f"{th.budget_fraction:.0%} of the budget, rank by predicted + {th.stability_weight:g}σ)")
        refuse = lambda c, msg, rej=(): NoPlacement(c, msg, stale, snap.version, tuple(reasons), tuple(rej))  # noqa: E731
        if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
            return refuse(Constraint.INPUT, f"latency budget must be a positive number of seconds, got {budget!r}")
        if not candidates:
            return refuse(Constraint.NO_CANDIDATES, "no candidate instances: the matcher admitted none for this request")

        rows, inst_of, missing = self._rows.rows(t, candidates)
        unknown = [Rejection(x.id, Constraint.UNKNOWN_GPU, f"`{x.deployment.host}/{x.deployment.gpu}` is not in the topology")
                   for x in missing]
        if not rows:
            return refuse(Constraint.UNKNOWN_GPU, "none of the candidates' GPUs is in the topology", unknown[:MAX_REJECTIONS])

        node: int | None = None
        if ingress is not None:
            node = t.fabric_index.get(ingress)
            if node is None or node not in snap.fabric_rows:
                known = ", ".join(t.fabric_nodes[n] for n in t.ingress.values())
                return refuse(Constraint.INPUT, f"unknown ingress `{ingress}` (known: {known})")
        elif not t.ingress:
            return refuse(Constraint.INPUT, "the topology has no ingress gateway to enter from")

        gpus = np.array(rows, dtype=np.int64)
        table = self._contract_table(contract, t, budget)
        with self._lock:
            if self._reserved_version != snap.version or len(self._reserved) != len(t.gpus):
                self._reserved, self._reserved_version = np.zeros(len(t.gpus)), snap.version
            reserved = self._reserved[gpus]
        ev = lookup(snap, th, gpus, node, table, reserved, budget)

        feasible, best = _feasible_and_best(ev)
        if best < 0:
            return self._refusal(snap, th, stale, reasons, unknown, ev, table.bounds, budget)

        choice, move = best, None
        key = affinity_key or f"{contract.name}@{ingress or '*'}"
        with self._lock:
            if session is not None:
                choice, move, why = self._session_choice(t, session, ev, feasible, best, contract)
                reasons.append(why)
            else:
                prev = self._sticky.get(key)
                if prev is not None:
                    r = _first_row_on(ev, feasible, prev)
                    if r >= 0:
                        if r != best and ev.rank[r] <= ev.rank[best] * (1 + self._hyst) + self._hyst_abs:
                            choice = r
                            reasons.append(f"kept {t.gpu_key(prev)} (hysteresis: within {self._hyst:.0%} + "
                                           f"{self._hyst_abs * 1e3:g} ms of the best, {t.gpu_key(int(gpus[best]))})")
                self._sticky[key] = int(gpus[choice])
            g = int(gpus[choice])
            share = float(ev.min_share[choice])
            if self._reserved_version == snap.version:
                self._reserved[g] += share
        return self._plan(snap, th, stale, inst_of[choice], ev, choice, feasible, table.bounds, share, move, reasons,
                          unknown, budget)

    def _rejections(
        self, snap: Snapshot, th: Thresholds, ev: Evaluation, unknown: list[Rejection], bounds, budget: float,
        limit: int, binding_first: bool,
    ) -> tuple[list[Rejection], Counter]:
        """Counts of failures by constraint, and the first few failed candidates explained
        (for a refusal, the binding constraint's victims first)."""
        t = snap.topology
        failed = np.flatnonzero(ev.fail >= 0)
        counts = Counter(x.constraint for x in unknown)
        for code, n in enumerate(np.bincount(ev.fail[failed], minlength=len(ORDER)).tolist()):
            if n:
                counts[ORDER[code]] += n
        room = max(0, limit - len(unknown))
        if binding_first and counts and counts.most_common(1)[0][0] in ORDER:
            code = ORDER.index(counts.most_common(1)[0][0])
            failed = failed[np.argsort(ev.fail[failed] != code, kind="stable")]
        rejected = list(unknown)
        for r in failed[:room].tolist():
            rejected.append(Rejection(t.gpu_key(int(ev.gpus[r])), ev.failed(r), self._detail(snap, th, ev, r, bounds, budget)))
        return rejected, counts

    def _session_choice(
        self, t, session: str, ev: Evaluation, feasible: np.ndarray, best: int, contract: Contract,
    ) -> tuple[int, SessionMove | None, str]:
        prev = self._sessions.get(session)
        feas_gpus = ev.gpus[feasible]
        if prev is not None:
            hit = np.nonzero(feas_gpus == prev)[0]
            if len(hit):
                return int(feasible[hit[0]]), None, f"session `{session}` stays on {t.gpu_key(prev)} (affinity to its state store)"
            rows = np.nonzero(ev.gpus == prev)[0]
            why = (f"{t.gpu_key(prev)} is no longer feasible ({ev.failed(int(rows[0])).value})" if len(rows)
                   else f"{t.gpu_key(prev)} is no longer a candidate")
            # prefer the state store's NUMA node, then its host, then the best anywhere
            numa, host = t.gpus[prev].numa, t.gpus[prev].host
            for level, same in (("NUMA node", t.gpu_numa[feas_gpus] == numa), ("host", t.gpu_host[feas_gpus] == host)):
                if same.any():
                    opts = feasible[same]
                    choice = int(opts[np.argmin(ev.rank[opts])])
                    break
            else:
                level, choice = "cluster", best
            to = int(ev.gpus[choice])
            self._sessions[session] = to
            move = SessionMove(session, t.gpu_key(prev), t.gpu_key(to), f"{why}; moved within the same {level}")
            return choice, move, f"session `{session}` moved: {move.reason}"
        choice = best
        state = contract.session.state if contract.session is not None else None
        if state is not None and state != "remote":
            stores = np.array([t.numa[t.gpus[int(g)].numa].store.value for g in feas_gpus])
            near = feasible[stores == state]
            if len(near):
                choice = int(near[np.argmin(ev.rank[near])])
        self._sessions[session] = int(ev.gpus[choice])
        return choice, None, f"session `{session}` starts on {t.gpu_key(int(ev.gpus[choice]))}" + (
            f" (next to its {state} state store)" if state and state != "remote" else "")

    def _plan(
        self, snap: Snapshot, th: Thresholds, stale: bool, inst: Instance, ev: Evaluation, r: int, feasible: np.ndarray,
        bounds, share: float, move: SessionMove | None, notes: list[str], unknown: list[Rejection], budget: float,
    ) -> PlacementPlan:
        t, f = snap.topology, snap.frame
        g = int(ev.gpus[r])
        gi = t.gpus[g]
        numa = t.numa[gi.numa]
        port = int(ev.port[r])
        lat = LatencyBreakdown(float(ev.network[r]), float(ev.queueing[r]), float(ev.compute[r]),
                               float(ev.dependencies[r]), float(ev.sigma[r]))
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
        bindings = ev.bindings(r)
        probes += [f"dependency_p99:{b.endpoint}" for b in bindings]
        if stale:
            probes.append("telemetry_staleness")
        b = bounds[gi.model]

        def write() -> tuple[tuple[str, ...], tuple[Rejection, ...]]:
            rejected, counts = self._rejections(snap, th, ev, unknown, bounds, budget, MAX_REJECTIONS_IN_PLAN, False)
            others = feasible[feasible != r]
            runner = int(others[np.argmin(ev.rank[others])]) if len(others) else None
            msg = (f"chose {t.gpu_key(g)} ({gi.model}): predicted {lat.describe()}, rank {ev.rank[r] * 1e3:.1f} ms "
                   f"(predicted + {th.stability_weight:g}σ)")
            if runner is not None:
                msg += (f"; runner-up {t.gpu_key(int(ev.gpus[runner]))} predicted {ev.total[runner] * 1e3:.1f} ms "
                        f"± {ev.sigma[runner] * 1e3:.1f} ms, rank {ev.rank[runner] * 1e3:.1f} ms")
            reasons = [msg, f"share {share:.3f} of the GPU from the {b.source.value}"
                       + (f" ({b.detail})" if b.source is ShareSource.CATALOG else ""), *notes]
            for d in bindings:
                reasons.append(f"dependency `{d.service}` bound to {d.role} endpoint `{d.endpoint}` "
                               f"({d.predicted * 1e3:.2f} ms ≤ {d.bound * 1e3:g} ms)")
            if counts:
                reasons.append("rejected: " + ", ".join(f"{n} by {c.value}" for c, n in counts.most_common()))
            return tuple(reasons), tuple(rejected[:MAX_REJECTIONS])

        return PlacementPlan(
            instance_id=inst.id, host=t.hosts[gi.host].name, gpu=gi.gpu_id, gpu_model=gi.model, numa_node=numa.node,
            cpus=numa.cpus, rdma_port=t.port_key(port) if port >= 0 else None, queue_depth=depth, probes=tuple(probes),
            latency=lat, share=share, share_source=b.source, dependencies=bindings, session_move=move,
            stale=stale, snapshot_version=snap.version, explanation=Explanation(write),
        )

    def _detail(self, snap: Snapshot, th, ev: Evaluation, r: int, bounds, budget: float) -> str:
        t, f = snap.topology, snap.frame
        g = int(ev.gpus[r])
        c = ev.failed(r)
        raw = ev.raw_total[r]
        would = f" (would predict {raw * 1e3:.1f} ms)" if math.isfinite(raw) else ""
        if c is Constraint.GPU_CLASS:
            return bounds[t.gpus[g].model].detail
        if c is Constraint.HEALTH:
            why = "SM throughput collapsed" if snap.gpu_collapsed[g] else "reported health"
            return f"health {snap.gpu_health[g]:.2f} < {th.min_health:.2f} ({why}, SM utilisation {f.gpu_sm_util[g]:.0%})"
        if c is Constraint.GPU_SHARE:
            with self._lock:  # the share placed on this snapshot since it was taken counts against it
                held = float(self._reserved[g]) if self._reserved_version == snap.version else 0.0
            since = f" ({snap.gpu_free[g]:.3f} free on the snapshot, {held:.3f} placed since)" if held else ""
            return f"free share {snap.gpu_free[g] - held:.3f} < required {ev.min_share[r]:.3f}{since}"
        if c is Constraint.PCIE:
            return f"PCIe utilisation {f.gpu_pcie_util[g]:.0%} > {th.max_pcie_util:.0%}"
        if c is Constraint.SESSION_STORE:
            return f"NUMA node has a `{t.numa[t.gpus[g].numa].store.value}` session store, the contract needs it colocated"
        if c is Constraint.PORT:
            local, remote = t.gpu_ports
            parts = []
            for p in (int(local[g]), int(remote[g])):
                if p >= 0:
                    state = ("down" if not f.port_up[p] else
                             f"watermark {f.port_watermark[p]:.0%} > {th.max_port_watermark:.0%}" if f.port_watermark[p] > th.max_port_watermark
                             else f"utilisation {f.port_util[p]:.0%} > {th.max_port_util:.0%}")
                    parts.append(f"{t.port_key(p)} {state}")
            return "RDMA port " + "; ".join(parts) + would
        if c is Constraint.NETWORK:
            return "no path from the ingress without crossing a congested or failed hop" + would
        if c is Constraint.DEPENDENCY:
            return ev.dependency_problem(r)
        if c is Constraint.LATENCY_BUDGET:
            return f"predicted {ev.total[r] * 1e3:.1f} ms > budget {budget * th.budget_fraction * 1e3:.1f} ms"
        return c.value if c else ""

    def _refusal(self, snap: Snapshot, th: Thresholds, stale: bool, reasons: list[str], unknown: list[Rejection],
                 ev: Evaluation, bounds, budget: float) -> NoPlacement:
        """No candidate is feasible: explain each constraint's first victims, the binding one first."""
        rejected, counts = self._rejections(snap, th, ev, unknown, bounds, budget, MAX_REJECTIONS, True)
        binding, n = counts.most_common(1)[0]
        example = next(x for x in rejected if x.constraint is binding)
        msg = (f"no feasible GPU among {sum(counts.values())} candidate(s): {binding.value} ruled out {n} "
               f"({example.gpu}: {example.detail})")
        if binding is Constraint.LATENCY_BUDGET:
            i = int(np.argmin(ev.total))
            msg = (f"no feasible GPU: latency budget {budget * 1e3:g} ms binds; the best candidate "
                   f"{snap.topology.gpu_key(int(ev.gpus[i]))} predicts {ev.total[i] * 1e3:.1f} ms")
        return NoPlacement(binding, msg, stale, snap.version, tuple(reasons), tuple(rejected[:MAX_REJECTIONS]))
