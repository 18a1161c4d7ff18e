"""The columnar fabric search (all sources at once) gives the figures of a
plain textbook Dijkstra over the same rules: blocked links and nodes are never relaxed,
endpoints and gateways are never transit, variance follows the chosen path."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from policyc.placer import Refresher, SimulatedCluster
from policyc.placer.fabric import blocked_links, blocked_nodes, hop_costs, search, search_many
from policyc.placer.topology import FabricLink, NodeKind, Topology


def reference(topology: Topology, source: int, lat: np.ndarray, q: np.ndarray, nv: np.ndarray,
              lb: np.ndarray, nb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pure-Python search this project used before (kept here as the oracle)."""
    n = len(topology.fabric_nodes)
    dist, var, done = [np.inf] * n, [0.0] * n, [False] * n
    dist[source] = 0.0
    heap = [(0.0, source)]
    while heap:
        d, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        if u != source and topology.fabric_kinds[u] in (NodeKind.ENDPOINT, NodeKind.INGRESS):
            continue
        for v, li in topology.adjacency[u]:
            if lb[li] or nb[v] or done[v]:
                continue
            nd = d + lat[li] + q[v]
            if nd < dist[v]:
                dist[v], var[v] = nd, var[u] + nv[v]
                heapq.heappush(heap, (nd, v))
    return np.array(dist), np.array(var)


@pytest.mark.parametrize("seed", [1, 4, 9])
def test_search_equals_the_reference_on_a_hostile_fabric(seed: int) -> None:
    sim = SimulatedCluster(seed, 48, 2, hosts_per_rack=4)
    t = sim.topology()
    rng = np.random.default_rng(seed)
    for li in rng.choice(len(t.links), 6, replace=False):  # failed links
        lk = t.links[int(li)]
        sim.link_down(t.fabric_nodes[lk.a], t.fabric_nodes[lk.b])
    switches = [i for i, k in enumerate(t.fabric_kinds) if k in (NodeKind.LEAF, NodeKind.SPINE)]
    for s in rng.choice(switches, 3, replace=False):  # congested switches: blocked
        sim.watermark(t.fabric_nodes[int(s)], 0.97)
    f = Refresher(sim).tick().frame
    th = Refresher(sim).thresholds
    lat, q, nv = hop_costs(t, f)
    lb, nb = blocked_links(f, th), blocked_nodes(t, f, th)
    assert lb.any() and nb.any()
    sources = sorted(set(t.ingress.values()) | {e.node for e in t.endpoints})
    dist, var = search_many(t, sources, lat, q, nv, lb, nb)
    for r, s in enumerate(sources):
        d_ref, v_ref = reference(t, s, lat, q, nv, lb, nb)
        np.testing.assert_array_equal(np.isinf(dist[r]), np.isinf(d_ref))
        np.testing.assert_allclose(dist[r], d_ref, rtol=1e-12, atol=0)
        np.testing.assert_allclose(var[r], v_ref, rtol=1e-9, atol=1e-30)
    assert np.isinf(dist).any()  # something became unreachable


def _tiny() -> Topology:
    names = ("in", "s1", "s2", "leaf", "ep", "ep2")
    kinds = (NodeKind.INGRESS, NodeKind.SPINE, NodeKind.SPINE, NodeKind.LEAF, NodeKind.ENDPOINT, NodeKind.ENDPOINT)
    links = (
        FabricLink(0, 1, 1e-3, 1e9), FabricLink(0, 1, 0.5e-3, 1e9),  # parallel links: the cheaper one counts
        FabricLink(0, 2, 2e-3, 1e9), FabricLink(1, 3, 1e-3, 1e9), FabricLink(2, 3, 1e-3, 1e9),
        FabricLink(3, 4, 1e-3, 1e9), FabricLink(4, 5, 1e-6, 1e9),  # ep -> ep2 only through an endpoint
    )
    return Topology(1, (), (), (), (), names, kinds, links, ())


def test_parallel_links_non_transit_endpoints_and_blocked_nodes() -> None:
    t = _tiny()
    lat = np.array([l.latency for l in t.links])
    q = np.array([0.0, 1e-4, 1e-4, 2e-4, 0.0, 0.0])
    nv = np.array([0.0, 1.0, 2.0, 4.0, 8.0, 16.0])
    none_l, none_n = np.zeros(len(t.links), dtype=bool), np.zeros(6, dtype=bool)
    d, v = search(t, 0, lat, q, nv, none_l, none_n)
    assert d[1] == pytest.approx(0.5e-3 + 1e-4) and d[3] == pytest.approx(0.5e-3 + 1e-4 + 1e-3 + 2e-4)
    assert v[3] == 1.0 + 4.0 and v[4] == 1.0 + 4.0 + 8.0
    assert np.isinf(d[5])  # ep2 hangs off an endpoint, which is never a hop
    blocked = none_n.copy()
    blocked[1] = True
    d2, v2 = search(t, 0, lat, q, nv, none_l, blocked)
    assert np.isinf(d2[1]) and d2[3] == pytest.approx(2e-3 + 1e-4 + 1e-3 + 2e-4) and v2[3] == 2.0 + 4.0
    # an endpoint as the source still reaches out from itself; both searches agree
    de, ve = search(t, 4, lat, q, nv, none_l, none_n)
    dr, vr = reference(t, 4, lat, q, nv, none_l, none_n)
    np.testing.assert_allclose(de, dr, rtol=1e-12)
    np.testing.assert_allclose(ve, vr)
    assert de[4] == 0.0 and ve[4] == 0.0 and de[5] == pytest.approx(1e-6)
