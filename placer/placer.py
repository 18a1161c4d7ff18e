"""Contract-aware placement: choose the GPU for one request, say why, never raise.

The signals (`signals/`, run from the per-tick tables: `lookup.py`) filter and rank the
candidates; the picker (`pick.py`: hysteresis, stickiness, sessions) chooses among the
feasible ones. The placer itself keeps the reservations made on the current snapshot (so a
burst within one tick spreads instead of piling onto the GPU that looked best when the
tick began), and writes plans and refusals in the signals' words.
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

from .candidate_sets import CandidateSets
from .catalog import DEFAULT_CATALOG
from .contract_table import ContractTable, contract_table
from .shares import ShareBound
from .evaluate import ORDER, Evaluation
from .evaluated import Evaluated, RowFixed
from .framework import Stage, Words
from .llm_price import RequestPrice, priced_bounds, priced_flops
from .lookup import lookup, scalar_rows
from .pick import Note, Picker
from .plan import (
    Constraint, Explanation, LatencyBreakdown, NoPlacement, PlacementPlan, RebalanceReport, Rejection, SessionMove,
    ShareSource,
)
from .signals import BY_CONSTRAINT, of_stage
from .signals.gateway_in_flight import InFlightCounts
from .sites import Sites
from .snapshot import Snapshot
from .thresholds import Thresholds

MAX_REJECTIONS = 20
MAX_REJECTIONS_IN_PLAN = 8  # a plan lists a few; a refusal lists more, binding constraint first
SCALAR_MAX = 32  # up to this many candidates, evaluate them on Python scalars (numpy's per-call overhead dominates)


_INF = float("inf")
_NOTED = of_stage(Stage.TICK)  # the signals whose plan notes a plan reads (measured, possibly stale, readings)


def _refused(snap: Snapshot, stale: bool, reasons: list[str | Note], c: Constraint, msg: str,
             rej: Sequence[Rejection] = ()) -> NoPlacement:
    """A refusal before any candidate was evaluated (bad input, nothing to place on)."""
    return NoPlacement(c, msg, stale, snap.version, tuple(map(str, reasons)), tuple(rej))


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
        self._picker = Picker(hysteresis, hysteresis_abs)
        self._clock = clock
        self._lock = threading.Lock()
        self._reserved: list[float] = []  # share reserved per GPU on the current snapshot
        self._reserved_version = -1
        self._tables: dict[tuple, ContractTable] = {}
        self._sets = CandidateSets()
        self._sites = Sites()
        self._affinities: dict[tuple[str, str | None], str] = {}

    # ------------------------------------------------------------------ public API

    def place(
        self, candidates: Sequence[Instance], budget: float, contract: Contract, session: str | None = None, *,
        ingress: str | None = None, affinity_key: str | None = None, price: RequestPrice | None = None,
    ) -> PlacementPlan | NoPlacement:
        """Choose a GPU among `candidates` for one request with `budget` seconds end to end.

        `ingress` names the fabric node the request enters at (default: the gateway of each
        candidate's region). `affinity_key` groups requests for hysteresis (default: the
        contract name and ingress). `price`: an LLM request's own tokens (`llm_price.py`),
        which set its share and its compute instead of the contract's constant `tokens`.
        Never raises: every failure is a `NoPlacement`.
        """
        snap: Snapshot | None = None
        try:
            snap = self._snapshots.current()
            return self._place(snap, candidates, budget, contract, session, ingress, affinity_key, price)
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
            sessions, sticky = self._picker.release_host(t, hi)
        return RebalanceReport(host, sessions, sticky)

    @property
    def in_flight(self) -> InFlightCounts:
        """This placer's live in-flight counts (`signals/gateway_in_flight.py`): the gateway
        calls `begin` when it forwards a pick and `end` when the request ends."""
        return self._picker.in_flight

    def session_gpu(self, session: str) -> str | None:
        g = self._picker.session_gpu(session)
        return None if g is None else self._snapshots.current().topology.gpu_key(g)

    # ------------------------------------------------------------------ internals

    def load_catalog(self, catalog: Iterable[GpuClass]) -> None:
        """Replace the GPU catalog (a bundle reload): every contract table is rebuilt from it."""
        with self._lock:
            self._catalog = {g.name: g for g in catalog}
            self._tables = {}

    @property
    def catalog(self) -> dict[str, GpuClass]:
        return dict(self._catalog)

    def bounds(self, contract: Contract) -> dict[str, ShareBound]:
        """The least share the placer reserves for one request of `contract` on each GPU
        class of the current topology (the bundle's stored share, or `meaning`'s)."""
        return dict(self._contract_table(contract, self._snapshots.current().topology).bounds)

    def _affinity(self, contract: str, ingress: str | None) -> str:
        """The default affinity key (`contract@ingress`, `*` for the regional gateways),
        written once per pair."""
        key = self._affinities.get((contract, ingress))
        if key is None:
            if len(self._affinities) > 4096:
                self._affinities.clear()
            key = self._affinities[(contract, ingress)] = f"{contract}@{ingress or '*'}"
        return key

    def _contract_table(self, contract: Contract, topology) -> ContractTable:
        """The contract's table for this topology and catalog, cached per contract object."""
        key = (id(contract),)
        hit = self._tables.get(key)
        if hit is None or hit.contract is not contract or hit.topology is not topology:
            if len(self._tables) > 256:
                self._tables.clear()
            hit = self._tables[key] = contract_table(contract, topology, self._catalog)
        return hit

    def _place(
        self, snap: Snapshot, candidates: Sequence[Instance], budget: float, contract: Contract, session: str | None,
        ingress: str | None, affinity_key: str | None, price: RequestPrice | None = None,
    ) -> PlacementPlan | NoPlacement:
        t = snap.topology
        now = self._clock()
        stale = snap.is_stale(now)
        th = snap.thresholds.conservative() if stale else snap.thresholds
        reasons: list[str | Note] = []
        if stale:
            reasons.append(f"snapshot {snap.version} is stale ({snap.age(now) * 1e3:.0f} ms old, limit "
                           f"{2 * snap.interval * 1e3:.0f} ms): conservative limits (port watermark ≤ {th.max_port_watermark:.0%}, "
                           f"{th.budget_fraction:.0%} of the budget, rank by predicted + {th.stability_weight:g}σ)")
        if not (type(budget) is float and 0.0 < budget < _INF) and \
                not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
            return _refused(snap, stale, reasons, Constraint.INPUT, f"latency budget must be a positive number of seconds, got {budget!r}")
        if not candidates:
            return _refused(snap, stale, reasons, Constraint.NO_CANDIDATES, "no candidate instances: the matcher admitted none for this request")

        cs = self._sets.get(t, candidates)
        unknown = cs.unknown
        if not cs.rows:
            return _refused(snap, stale, reasons, Constraint.UNKNOWN_GPU, "none of the candidates' GPUs is in the topology", unknown[:MAX_REJECTIONS])

        node: int | None = None
        if ingress is not None:
            node = t.fabric_index.get(ingress)
            if node is None or node not in snap.fabric_rows:
                known = ", ".join(t.fabric_nodes[n] for n in t.ingress.values())
                return _refused(snap, stale, reasons, Constraint.INPUT, f"unknown ingress `{ingress}` (known: {known})")
        elif not t.ingress:
            return _refused(snap, stale, reasons, Constraint.INPUT, "the topology has no ingress gateway to enter from")

        table = self._contract_table(contract, t)
        bounds = table.bounds
        priced: tuple[np.ndarray, float] | None = None
        if price is not None and contract.llm is not None:  # this request's own share and FLOPs
            bounds = priced_bounds(contract, price, table.bounds, self._catalog)
            names, model_idx = t.gpu_models
            per_class = np.array([bounds[n].min_share for n in names], dtype=np.float64)
            priced = (per_class[model_idx[cs.gpus]], priced_flops(contract.llm, price)[1])
        with self._lock:
            if self._reserved_version != snap.version or len(self._reserved) != len(t.gpus):
                self._reserved, self._reserved_version = [0.0] * len(t.gpus), snap.version
            reserved = cs.take(self._reserved)
        gathered = None
        if priced is None and len(cs.rows) <= SCALAR_MAX:
            tt, gathered = cs.gathered(snap, th, node, table)
            outs = scalar_rows(tt.layout, gathered.rows, reserved, table.flops, budget * th.budget_fraction,
                               th.stability_weight, gathered.figures)
            ev = Evaluated.of_lists(cs.gpus, cs.rows, tt, gathered, outs)
        else:
            ev = Evaluated.of_evaluation(lookup(snap, th, cs.gpus, node, table, np.array(reserved), budget, priced))

        best = ev.best
        if best < 0:
            # Reservations only grow within a tick, so a candidate set refused once stays
            # refused, word for word, until a share on one of its GPUs or the budget moves:
            # the refusal is written once and handed to the requests that follow (a stale
            # snapshot's refusal names its age, so it is written afresh).
            shares = (tuple(reserved), budget)
            if gathered is not None and not stale and gathered.refusal is not None and gathered.refusal[0] == shares:
                return gathered.refusal[1]
            out = self._refusal(snap, th, stale, reasons, unknown, ev.evaluation(), bounds, budget)
            if gathered is not None and not stale:
                gathered.refusal = (shares, out)
            return out

        key = affinity_key or self._affinity(contract.name, ingress)
        with self._lock:
            choice, move, note = self._picker.choose(t, ev, contract, session, key, snap.frame.measured, self._catalog)
            predicted_ttft = self._picker.predicted
            if note is not None:
                reasons.append(note)
            row, queueing, compute = ev.row(choice, snap, self._sites)
            share = row.min_share
            if self._reserved_version == snap.version:
                self._reserved[row.gpu] += share
        return self._plan(snap, th, stale, cs.known[choice], ev, choice, row, queueing, compute, bounds, move, reasons,
                          unknown, budget, predicted_ttft)

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
            rejected.append(Rejection(t.gpu_key(int(ev.gpus[r])), ev.constraint(r), self._detail(snap, th, ev, r, bounds, budget)))
        return rejected, counts

    def _plan(
        self, snap: Snapshot, th: Thresholds, stale: bool, inst: Instance, ev: Evaluated, r: int, row: RowFixed,
        queueing: float, compute: float, bounds, move: SessionMove | None, notes: list[str | Note], unknown: list[Rejection], budget: float,
        predicted_ttft: float | None = None,
    ) -> PlacementPlan:
        t = snap.topology
        g, share = row.gpu, row.min_share
        where = row.site
        lat = LatencyBreakdown(row.network, queueing, compute, row.dependencies, row.sigma)
        bindings = row.bindings
        probes = row.probes
        if stale:
            probes += ("telemetry_staleness",)
        b = bounds[where.model]

        def write() -> tuple[tuple[str, ...], tuple[Rejection, ...]]:
            full = ev.evaluation()
            rejected, counts = self._rejections(snap, th, full, unknown, bounds, budget, MAX_REJECTIONS_IN_PLAN, False)
            feasible = np.array(ev.feasible, dtype=np.int64)
            others = feasible[feasible != r]
            runner = int(others[np.argmin(full.rank[others])]) if len(others) else None
            msg = (f"chose {t.gpu_key(g)} ({where.model}): predicted {lat.describe()}, rank {full.rank[r] * 1e3:.1f} ms "
                   f"(predicted + {th.stability_weight:g}σ)")
            if runner is not None:
                msg += (f"; runner-up {t.gpu_key(int(full.gpus[runner]))} predicted {full.total[runner] * 1e3:.1f} ms "
                        f"± {full.sigma[runner] * 1e3:.1f} ms, rank {full.rank[runner] * 1e3:.1f} ms")
            reasons = [msg, f"share {share:.3f} of the GPU from the {b.source.value}"
                       + (f" ({b.detail})" if b.source is not ShareSource.SOLVER else ""), *map(str, notes)]
            for sig in _NOTED:  # a measured reading the prediction left out as stale, say
                line = sig.plan_note(snap, g)
                if line is not None:
                    reasons.append(line)
            for d in bindings:
                reasons.append(f"dependency `{d.service}` bound to {d.role} endpoint `{d.endpoint}` "
                               f"({d.predicted * 1e3:.2f} ms ≤ {d.bound * 1e3:g} ms)")
            if counts:
                reasons.append("rejected: " + ", ".join(f"{n} by {c.value}" for c, n in counts.most_common()))
            return tuple(reasons), tuple(rejected[:MAX_REJECTIONS])

        return PlacementPlan(
            instance_id=inst.id, host=where.host, gpu=where.gpu, gpu_model=where.model, numa_node=where.numa_node,
            cpus=where.cpus, rdma_port=where.rdma_port, queue_depth=where.queue_depth, probes=probes,
            latency=lat, share=share, share_source=b.source, dependencies=bindings, session_move=move,
            stale=stale, snapshot_version=snap.version, explanation=Explanation(write), contract_ttft_s=predicted_ttft,
        )

    def _detail(self, snap: Snapshot, th: Thresholds, ev: Evaluation, r: int, bounds, budget: float) -> str:
        """Why candidate `r` failed, in the words of the signal it failed."""
        c = ev.failed(r)
        sig = BY_CONSTRAINT.get(c) if c is not None else None
        if sig is None:
            return c.value if c else ""
        return sig.detail(Words(snap, th, ev, bounds, budget, lambda g: self._held(snap, g)), r)

    def _held(self, snap: Snapshot, g: int) -> float:
        """The share placed on GPU `g` since `snap` was taken (it counts against its free share)."""
        with self._lock:
            return float(self._reserved[g]) if self._reserved_version == snap.version else 0.0

    def _refusal(self, snap: Snapshot, th: Thresholds, stale: bool, reasons: list[str | Note], unknown: list[Rejection],
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
        return NoPlacement(binding, msg, stale, snap.version, tuple(map(str, reasons)), tuple(rejected[:MAX_REJECTIONS]))
