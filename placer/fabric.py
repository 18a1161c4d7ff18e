"""Constrained shortest paths over the switch fabric (a Dijkstra variant).

The fabric (ingress gateways, core, spines, leaves, service endpoints) is small next to
the hosts it connects (about a hundred nodes for 8,000 GPUs), so the refresher runs one
search per ingress and per endpoint each tick and the placer finishes a candidate's path
(leaf -> port -> NUMA -> GPU) in constant time. The variant: hops that are down, or whose
utilisation or buffer watermark crosses a threshold, are not relaxed at all (a hard
constraint, not a cost), and each label carries the path's variance next to its latency
so the placer can prefer stable paths.

The search is a label-correcting shortest path (Bellman-Ford) over columns: every source at
once, each round one vectorised relaxation of every edge (`minimum.reduceat` over the edges
grouped by head), until no label improves, at most one round per hop of the longest
shortest path (a handful on a fabric). A pure-Python Dijkstra here cost ~0.5 ms per source
and, run by the refresher thread, held the GIL against decisions in flight; scipy's
compiled Dijkstra was ~0.8 ms for all sources but brought 143 MB of scipy for this one call
(issue 41); the columns stay within numpy, which the placer has anyway. Endpoints and
ingresses are never transit nodes, yet each is a source: such a source searches from a
copy of itself that has its outgoing edges while the node itself has none. Predecessors
are read off the converged labels (an edge whose relaxation gives the label exactly;
weights are positive, so they form a tree); variances follow that tree, summed by pointer
jumping over all rows at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from .latency import buffer_delay, buffer_sigma, serialization_delay
from .telemetry import TelemetryFrame
from .thresholds import Thresholds
from .topology import Topology

SWITCH_BUFFER = 32e6  # bytes of shared buffer per switch
SWITCH_BANDWIDTH = 50e9  # bytes/s drain rate


def hop_costs(topology: Topology, frame: TelemetryFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(link latency incl. serialisation, node queueing delay, node variance) for this frame."""
    lat = np.array([l.latency for l in topology.links]) + serialization_delay(
        frame.link_util, np.array([l.bandwidth for l in topology.links]))
    q = buffer_delay(frame.switch_watermark, SWITCH_BUFFER, SWITCH_BANDWIDTH)
    var = buffer_sigma(frame.switch_watermark, SWITCH_BUFFER, SWITCH_BANDWIDTH) ** 2
    return lat, q, var


def blocked_nodes(topology: Topology, frame: TelemetryFrame, th: Thresholds) -> np.ndarray:
    return frame.switch_watermark > th.max_switch_watermark


def blocked_links(frame: TelemetryFrame, th: Thresholds) -> np.ndarray:
    return (~frame.link_up) | (frame.link_util > th.max_link_util)


def search(
    topology: Topology, source: int, link_lat: np.ndarray, node_q: np.ndarray, node_var: np.ndarray,
    link_blocked: np.ndarray, node_blocked: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One-way latency and variance from `source` to every fabric node (inf: unreachable
    without crossing a blocked hop). Endpoints and ingresses are never transit nodes."""
    dist, var = search_many(topology, (source,), link_lat, node_q, node_var, link_blocked, node_blocked)
    return dist[0], var[0]


@dataclass(frozen=True, eq=False)
class _SearchGraph:
    """The fixed shape of the search for one topology and set of sources: which directed
    edges exist (transit rule and source copies applied), grouped by (from, to) so that
    parallel links collapse to the cheapest, in CSR order. Per tick only weights change."""

    size: int  # fabric nodes + source copies
    starts: np.ndarray  # the node each source row searches from (itself or its copy)
    link: np.ndarray  # per candidate edge: link index
    head: np.ndarray  # per candidate edge: the node it enters
    groups: np.ndarray  # first candidate edge of each (from, to) pair
    indices: np.ndarray  # CSR column per pair
    indptr: np.ndarray
    tail: np.ndarray  # per pair: the node it leaves, in head order (`by_head`)
    by_head: np.ndarray  # pair indices sorted by the node they enter
    head_starts: np.ndarray  # first position in `by_head` of each entered node's pairs
    heads: np.ndarray  # the entered node of each group in `head_starts`
    head_of: np.ndarray  # per pair, in head order: the node it enters


@lru_cache(maxsize=8)
def _search_graph(topology: Topology, sources: tuple[int, ...]) -> _SearchGraph:
    n = len(topology.fabric_nodes)
    src = np.array(sources, dtype=np.int64)
    a, b = topology.link_ends
    transit = topology.fabric_transit
    copies = np.flatnonzero(~transit[src])  # a non-transit source searches from its own copy
    copy_of = np.full(n, -1, dtype=np.int64)
    copy_of[src[copies]] = n + np.arange(len(copies))
    m = n + len(copies)
    li = np.concatenate((np.arange(len(a)), np.arange(len(a))))
    u = np.concatenate((a, b))
    v = np.concatenate((b, a))
    from_copy = copy_of[u] >= 0
    keep = transit[u]
    u = np.concatenate((u[keep], copy_of[u[from_copy]]))
    v = np.concatenate((v[keep], v[from_copy]))
    li = np.concatenate((li[keep], li[from_copy]))
    order = np.lexsort((v, u))
    u, v, li = u[order], v[order], li[order]
    first = np.ones(len(u), dtype=bool)
    first[1:] = (u[1:] != u[:-1]) | (v[1:] != v[:-1])
    groups = np.flatnonzero(first)
    indptr = np.searchsorted(u[groups], np.arange(m + 1)).astype(np.int32)
    starts = np.where(copy_of[src] >= 0, copy_of[src], src)
    pair_u, pair_v = u[groups], v[groups]
    by_head = np.argsort(pair_v, kind="stable")
    hv = pair_v[by_head]
    head_first = np.ones(len(hv), dtype=bool)
    head_first[1:] = hv[1:] != hv[:-1]
    head_starts = np.flatnonzero(head_first)
    return _SearchGraph(m, starts, li, v, groups, pair_v.astype(np.int32), indptr,
                        pair_u[by_head], by_head, head_starts, hv[head_starts], hv)


def _shortest(g: _SearchGraph, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distance, predecessor) from each of `g.starts` to every node of `g`; -1: none.

    `weights` is per (from, to) pair, positive or infinite (never relaxed)."""
    rows = len(g.starts)
    cols = np.arange(rows)
    dist = np.full((g.size, rows), np.inf)  # node-major: each round gathers whole rows
    dist[g.starts, cols] = 0.0
    if not len(weights):
        return dist.T, np.full((rows, g.size), -1, dtype=np.int64)
    w = weights[g.by_head][:, None]
    for _ in range(g.size):  # a shortest path has at most size - 1 hops
        best = np.minimum.reduceat(dist[g.tail] + w, g.head_starts, axis=0)
        old = dist[g.heads]
        if not (best < old).any():
            break
        dist[g.heads] = np.minimum(best, old)
    cand = dist[g.tail] + w
    exact = (cand == dist[g.head_of]) & np.isfinite(cand)
    pos = np.where(exact, np.arange(len(w))[:, None], len(w))
    first = np.minimum.reduceat(pos, g.head_starts, axis=0)
    pred = np.full((g.size, rows), -1, dtype=np.int64)
    pred[g.heads] = np.where(first < len(w), g.tail[np.minimum(first, len(w) - 1)], -1)
    pred[g.starts, cols] = -1
    return np.ascontiguousarray(dist.T), np.ascontiguousarray(pred.T)


def search_many(
    topology: Topology, sources: Sequence[int], link_lat: np.ndarray, node_q: np.ndarray, node_var: np.ndarray,
    link_blocked: np.ndarray, node_blocked: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`search` from every source at once: (latency, variance), each sources x fabric nodes.

    Entering node v over link l costs `link_lat[l] + node_q[v]`; a blocked link, or a link
    into a blocked node, is never relaxed (its weight is infinite, and Dijkstra never
    improves on infinity); a path's variance is the sum of `node_var` over its nodes
    after the source."""
    n = len(topology.fabric_nodes)
    src = np.asarray(sources, dtype=np.int64)
    if len(src) == 0 or n == 0 or not len(topology.links):
        dist = np.full((len(src), n), np.inf)
        dist[np.arange(len(src)), src] = 0.0
        return dist, np.zeros((len(src), n))
    g = _search_graph(topology, tuple(src.tolist()))
    w = link_lat[g.link] + node_q[g.head]
    w[np.asarray(link_blocked, dtype=bool)[g.link] | np.asarray(node_blocked, dtype=bool)[g.head]] = np.inf
    dist, pred = _shortest(g, np.minimum.reduceat(w, g.groups))
    rows = np.arange(len(src))
    dist[rows, src] = 0.0  # a copied source reaches itself without moving
    # variance: node_var summed over each node's path back to (excluding) its source
    m = g.size
    nv = np.zeros(m)
    nv[:n] = node_var
    flat = pred.ravel()
    base = (rows * m)[:, None]
    var = np.where(pred >= 0, nv[None, :], 0.0)
    cur = pred
    while True:
        valid = cur >= 0
        if not valid.any():
            break
        c = np.where(valid, cur, 0)
        up = flat[(base + c).ravel()].reshape(cur.shape)
        var += np.where(valid & (up >= 0), nv[c], 0.0)
        cur = np.where(valid, up, -1)
    var[rows, src] = 0.0
    return dist[:, :n], var[:, :n]
