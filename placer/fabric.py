"""Constrained shortest paths over the switch fabric (a Dijkstra variant).

The fabric (ingress gateways, core, spines, leaves, service endpoints) is small next to
the hosts it connects (about a hundred nodes for 8,000 GPUs), so the refresher runs one
search per ingress and per endpoint each tick and the placer finishes a candidate's path
(leaf -> port -> NUMA -> GPU) in constant time. The variant: hops that are down, or whose
utilisation or buffer watermark crosses a threshold, are not relaxed at all (a hard
constraint, not a cost), and each label carries the path's variance next to its latency
so the placer can prefer stable paths.
"""

from __future__ import annotations

import heapq

import numpy as np

from .latency import buffer_delay, buffer_sigma, serialization_delay
from .telemetry import TelemetryFrame
from .thresholds import Thresholds
from .topology import NodeKind, Topology

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
    n = len(topology.fabric_nodes)
    dist = [np.inf] * n
    var = [0.0] * n
    adj = topology.adjacency
    kinds = topology.fabric_kinds
    lat = link_lat.tolist()
    q = node_q.tolist()
    nv = node_var.tolist()
    lb = link_blocked.tolist()
    nb = node_blocked.tolist()
    dist[source] = 0.0
    heap = [(0.0, source)]
    done = [False] * n
    while heap:
        d, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        if u != source and kinds[u] in (NodeKind.ENDPOINT, NodeKind.INGRESS):
            continue
        for v, li in adj[u]:
            if lb[li] or nb[v] or done[v]:
                continue
            nd = d + lat[li] + q[v]
            if nd < dist[v]:
                dist[v] = nd
                var[v] = var[u] + nv[v]
                heapq.heappush(heap, (nd, v))
    return np.array(dist), np.array(var)
