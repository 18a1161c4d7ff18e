"""An immutable picture of the cluster at one tick, with everything placement derives
from it precomputed: effective GPU health, free share, queueing and its spread, port
delays, fabric distances from every ingress and service endpoint, and a score per GPU.

Built by the refresher once per tick and then only read, by any number of threads, so a
placement never sees half an update. Age and staleness are measured against the
monotonic clock at which the snapshot was taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Generator, Iterator

import networkx as nx
import numpy as np

from .fabric import blocked_links, blocked_nodes, hop_costs, search_many
from .latency import (
    VOLATILITY_GAIN_GPU, VOLATILITY_GAIN_PORT, buffer_delay, buffer_sigma, gpu_queue, gpu_queue_sigma,
    serialization_delay,
)
from .telemetry import TelemetryFrame
from .thresholds import Thresholds
from .topology import Topology

EWMA_ALPHA = 0.3
COLLAPSE_RATIO = 0.5  # SM utilisation below half of the allocated demand: throughput collapse
COLLAPSE_MIN_DEMAND = 0.3
COLLAPSED_HEALTH = 0.2
SCORE_SIGMA_SCALE = 5e-3  # seconds of path sigma that halve a GPU's score
SEARCH_CHUNK = 6  # fabric search sources per build step (see `build_steps`)
SEARCH_STEPS_MOST = 6  # but at most this many chunks: `fabric` keeps the search graphs of 8 source sets


@dataclass(frozen=True, slots=True)
class Volatility:
    """EWMA mean and variance of the signals whose swings make a placement unstable."""

    sm_mean: np.ndarray
    sm_var: np.ndarray
    wm_mean: np.ndarray
    wm_var: np.ndarray

    @staticmethod
    def first(frame: TelemetryFrame) -> "Volatility":
        return Volatility(frame.gpu_sm_util.copy(), np.zeros_like(frame.gpu_sm_util),
                          frame.port_watermark.copy(), np.zeros_like(frame.port_watermark))

    def update(self, frame: TelemetryFrame) -> "Volatility":
        a = EWMA_ALPHA
        ds = frame.gpu_sm_util - self.sm_mean
        dw = frame.port_watermark - self.wm_mean
        return Volatility(self.sm_mean + a * ds, (1 - a) * (self.sm_var + a * ds * ds),
                          self.wm_mean + a * dw, (1 - a) * (self.wm_var + a * dw * dw))


@dataclass(frozen=True, eq=False)
class Snapshot:
    version: int
    topology: Topology
    frame: TelemetryFrame
    thresholds: Thresholds
    interval: float
    taken_at: float  # time.monotonic() when sampled
    volatility: Volatility
    gpu_health: np.ndarray  # effective: reported x anomaly board x collapse detection
    gpu_collapsed: np.ndarray
    gpu_free: np.ndarray  # share of the GPU not in use
    gpu_rho: np.ndarray
    gpu_queue: np.ndarray  # seconds
    gpu_sigma: np.ndarray  # seconds
    port_delay: np.ndarray  # seconds, one way: buffer drain + serialisation
    port_sigma: np.ndarray
    fabric_rows: dict[int, int]  # fabric node -> row of the distance tables
    fabric_dist: np.ndarray  # rows x fabric nodes, one-way seconds (inf: blocked)
    fabric_var: np.ndarray
    scores: np.ndarray
    build_seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    # per-tick lookup tables derived from this snapshot alone (see `paths.py`), keyed by
    # (thresholds, ingress); filled by the refresher before publishing and on first use
    tables: dict = field(default_factory=dict, repr=False, compare=False)
    # the keys of `tables` requests read (not merely warmed): what the next tick warms
    used: set = field(default_factory=set, repr=False, compare=False)
    # each GPU's best port onto the fabric per (thresholds, ingress) (`port_paths.py`): the
    # telemetry's alone, so shared with the snapshots that only take the readings again
    port_paths: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ time

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.taken_at

    def is_stale(self, now: float | None = None) -> bool:
        """Older than twice the refresh interval: what it shows may no longer hold."""
        return self.age(now) > 2.0 * self.interval

    def remeasured(self, version: int, frame: TelemetryFrame) -> "Snapshot":
        """This snapshot with `frame`'s measured readings (the model servers' own, newer
        than the rest of the frame): everything derived from the telemetry is shared, the
        per-tick tables, which read the readings, start empty (each GPU's best port, which
        does not, is kept). `taken_at` stays the telemetry's: staleness is the fabric's age,
        each reading carries its own."""
        return replace(self, version=version, frame=frame, build_seconds=0.0, tables={}, used=set())

    # ------------------------------------------------------------------ scores

    def gpu_score(self, host: str, gpu: str) -> float:
        """How good a place this GPU is right now, in [0, 1] (higher is better); 0 for an
        unknown GPU. The matcher ranks best-k candidates with it."""
        i = self.topology.gpu_index.get((host, gpu))
        return 0.0 if i is None else float(self.scores[i])

    def score_changes(self, previous: "Snapshot | None", min_delta: float = 0.05) -> Iterator[tuple[str, str, float]]:
        """(host, gpu, score) for every GPU whose score moved by at least `min_delta` since
        `previous` (every GPU when there is none or the topology changed)."""
        t = self.topology
        if previous is None or previous.topology is not t:
            idx = np.arange(len(t.gpus))
        else:
            idx = np.nonzero(np.abs(self.scores - previous.scores) >= min_delta)[0]
        for i in idx.tolist():
            g = t.gpus[i]
            yield t.hosts[g.host].name, g.gpu_id, float(self.scores[i])

    # ------------------------------------------------------------------ graph view

    def fabric_distance(self, source: int) -> tuple[np.ndarray, np.ndarray] | None:
        row = self.fabric_rows.get(source)
        return None if row is None else (self.fabric_dist[row], self.fabric_var[row])

    @cached_property
    def unconstrained(self) -> dict[int, np.ndarray]:
        """Fabric distances ignoring thresholds (links must still be up): computed only to
        explain a refusal ("reachable, but only through a congested hop")."""
        t, f = self.topology, self.frame
        lat, q, var = hop_costs(t, f)
        none = np.zeros(len(t.fabric_nodes), dtype=bool)
        srcs = list(self.fabric_rows)
        dist, _ = search_many(t, srcs, lat, q, var, ~f.link_up, none)
        return {src: dist[i] for i, src in enumerate(srcs)}

    def graph(self) -> nx.Graph:
        """The networkx graph of the cluster with this tick's weights on it (for explaining
        and inspecting; placement reads the arrays)."""
        t, f = self.topology, self.frame
        g = t.graph()
        for i, _gi in enumerate(t.gpus):
            g.nodes[t.gpu_key(i)].update(
                sm_util=float(f.gpu_sm_util[i]), mem_free=float(f.gpu_mem_free[i]), pcie_util=float(f.gpu_pcie_util[i]),
                health=float(self.gpu_health[i]), score=float(self.scores[i]),
            )
        for i, p in enumerate(t.ports):
            key = t.port_key(i)
            g.nodes[key].update(watermark=float(f.port_watermark[i]), util=float(f.port_util[i]), up=bool(f.port_up[i]))
            g.edges[key, t.fabric_nodes[p.switch]].update(
                latency=float(self.port_delay[i]), util=float(f.port_util[i]), watermark=float(f.port_watermark[i]))
        for li, l in enumerate(t.links):
            g.edges[t.fabric_nodes[l.a], t.fabric_nodes[l.b]].update(util=float(f.link_util[li]), up=bool(f.link_up[li]))
        for ni, name in enumerate(t.fabric_nodes):
            g.nodes[name]["watermark"] = float(f.switch_watermark[ni])
        for ei, e in enumerate(t.endpoints):
            g.nodes[e.name]["p99"] = float(f.endpoint_p99[ei])
        return g


def build_snapshot(
    version: int, topology: Topology, frame: TelemetryFrame, previous: Snapshot | None, health_overlay: np.ndarray | None,
    thresholds: Thresholds, interval: float, taken_at: float,
) -> Snapshot:
    """Derive everything placement needs from one frame (vectorised; one fabric search per
    ingress and endpoint)."""
    steps = build_steps(version, topology, frame, previous, health_overlay, thresholds, interval, taken_at)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def build_steps(
    version: int, topology: Topology, frame: TelemetryFrame, previous: Snapshot | None, health_overlay: np.ndarray | None,
    thresholds: Thresholds, interval: float, taken_at: float,
) -> Generator[str, None, Snapshot]:
    """`build_snapshot` in steps (GPU and port state; the fabric's hop costs; the fabric
    search, `SEARCH_CHUNK` sources a step; scores), yielding between two, for a refresher
    that lets requests in between (`build_seconds` is then the steps' span, waits
    included). One search from all 24 sources of the benchmarks' cluster is ~0.65 ms of
    CPU, a chunk of 6 ~0.2 ms: a search's fixed cost (~0.15 ms) is paid per chunk, so the
    chunked search costs ~0.2 ms more per tick in all, but no step holds a serving loop
    longer than a chunk. Each source's row is its own Dijkstra search, so the rows of
    the chunks, stacked in order, are the one search's. Each yield names the step it
    ends (the refresher records it beside the step's span)."""
    t0 = time.perf_counter()
    t, f = topology, frame
    vol = (previous.volatility.update(f) if previous is not None and previous.topology is t
           else Volatility.first(f))
    demand = np.where(np.isnan(f.gpu_demand), f.gpu_sm_util, f.gpu_demand)
    collapsed = (demand >= COLLAPSE_MIN_DEMAND) & (f.gpu_sm_util < COLLAPSE_RATIO * demand)
    health = f.gpu_health * (1.0 if health_overlay is None else health_overlay)
    health = np.where(collapsed, np.minimum(health, COLLAPSED_HEALTH), health)
    rho = np.maximum(demand, f.gpu_sm_util)
    free = np.clip(1.0 - rho, 0.0, 1.0)
    gq = gpu_queue(rho)
    gs = np.sqrt(gpu_queue_sigma(rho) ** 2 + (VOLATILITY_GAIN_GPU * np.sqrt(vol.sm_var)) ** 2)

    pdelay = buffer_delay(f.port_watermark, t.port_buffer, t.port_bandwidth) + serialization_delay(f.port_util, t.port_bandwidth)
    drain = t.port_buffer / t.port_bandwidth
    psig = np.sqrt(buffer_sigma(f.port_watermark, t.port_buffer, t.port_bandwidth) ** 2
                   + (VOLATILITY_GAIN_PORT * drain * np.sqrt(vol.wm_var)) ** 2)

    yield "snapshot: GPU and port state"
    lat, q, var = hop_costs(t, f)
    lb, nb = blocked_links(f, thresholds), blocked_nodes(t, f, thresholds)
    sources = sorted(set(t.ingress.values()) | {e.node for e in t.endpoints})
    rows = {s: i for i, s in enumerate(sources)}
    dist = np.full((len(sources), len(t.fabric_nodes)), np.inf)
    dvar = np.zeros((len(sources), len(t.fabric_nodes)))
    chunk = max(SEARCH_CHUNK, -(-len(sources) // SEARCH_STEPS_MOST))
    done = "snapshot: hop costs"
    for lo in range(0, len(sources), chunk):  # rows in `sources` order
        yield done
        dist[lo:lo + chunk], dvar[lo:lo + chunk] = search_many(t, sources[lo:lo + chunk], lat, q, var, lb, nb)
        done = "snapshot: fabric search"
    yield done

    local, _ = t.gpu_ports
    has_port = local >= 0
    lp = np.where(has_port, local, 0)
    port_ok = has_port & f.port_up[lp] & (f.port_watermark[lp] <= thresholds.max_port_watermark) if len(t.ports) else np.zeros(len(t.gpus), dtype=bool)
    path_sigma = np.sqrt(gs ** 2 + (psig[lp] ** 2 if len(t.ports) else 0.0))
    scores = health * (0.4 + 0.6 * free) / (1.0 + path_sigma / SCORE_SIGMA_SCALE)
    scores = np.where((health < thresholds.min_health) | ~port_ok, 0.0, np.clip(scores, 0.0, 1.0))
    arrays = [health, collapsed, free, rho, gq, gs, pdelay, psig, dist, dvar, scores]
    for a in arrays:
        a.setflags(write=False)
    return Snapshot(
        version=version, topology=t, frame=f, thresholds=thresholds, interval=interval, taken_at=taken_at,
        volatility=vol, gpu_health=health, gpu_collapsed=collapsed, gpu_free=free, gpu_rho=rho, gpu_queue=gq,
        gpu_sigma=gs, port_delay=pdelay, port_sigma=psig, fabric_rows=rows, fabric_dist=dist, fabric_var=dvar,
        scores=scores, build_seconds=time.perf_counter() - t0, notes=f.notes,
    )

