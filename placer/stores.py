"""Session stores as dependencies: a service of kind `nvme` (or `host_memory`) is the store
attached to the GPU's own NUMA node, not something reached over the fabric.

A contract such as `support-chatbot` declares `service conversation-store { kind: nvme;
p99: <= 4 ms }`: its state lives on the NVMe drive next to the GPU (the design's stateful
session case: reads 18 ms remote, 3.2 ms local). No switch, port or gateway sits on that
path, so searching the fabric for an `nvme` endpoint would always fail. Instead each
NUMA node's store is an endpoint of its own, reachable only from the GPUs of that NUMA
node with the store's read latency; a GPU whose NUMA node has another kind of store
cannot reach it at all. The table is built once per topology with nominal figures; where
the host's agent measures its store (a session's state written and read back in the
store's directory, `cluster/session_probe.py`), the reading under the store's endpoint name
(`host/numaN/kind`, key `read_s`) replaces the nominal figure while it is fresh
(`measured_latency`).
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from functools import lru_cache
from typing import Mapping

import numpy as np

from .readings import Reading
from .topology import Endpoint, EndpointRole, StoreKind, Topology

# p99 of a state read from a store on the GPU's NUMA node (seconds): an NVMe read over the
# local PCIe root complex, or host DRAM across the PCIe link. Nominal figures, for a store
# no host agent measures (see `measured_latency`).
STORE_P99: dict[StoreKind, float] = {StoreKind.NVME: 3.2e-3, StoreKind.HOST_MEMORY: 0.3e-3}
LOCAL_STORE_KINDS: frozenset[str] = frozenset(k.value for k in STORE_P99)


def is_local_store(kind: str) -> bool:
    """Whether a dependency of this kind is the session store on the GPU's NUMA node."""
    return kind in LOCAL_STORE_KINDS


@dataclass(frozen=True, eq=False)
class StoreTable:
    """For one store kind: one endpoint per NUMA node holding such a store, and per GPU
    the index of its own NUMA node's endpoint with the read latency (inf: none there)."""

    endpoints: tuple[Endpoint, ...]
    best: np.ndarray  # index into `endpoints`, per GPU (0 where the GPU has none)
    latency: np.ndarray  # seconds per GPU (inf: the GPU's NUMA node has no store of this kind)


@lru_cache(maxsize=16)
def store_table(topology: Topology, kind: str) -> StoreTable:
    """The table for `kind` (one of LOCAL_STORE_KINDS) on this topology, built once."""
    store = StoreKind(kind)
    eps: list[Endpoint] = []
    at_numa = np.full(len(topology.numa), -1, dtype=np.int64)
    for i, n in enumerate(topology.numa):
        if n.store is store:
            h = topology.hosts[n.host]
            at_numa[i] = len(eps)
            eps.append(Endpoint(f"{h.name}/numa{n.node}/{kind}", kind, EndpointRole.LOCAL, h.region, -1))
    idx = at_numa[topology.gpu_numa] if len(topology.gpus) else np.zeros(0, dtype=np.int64)
    best = np.where(idx >= 0, idx, 0)
    latency = np.where(idx >= 0, STORE_P99[store], np.inf)
    best.setflags(write=False)
    latency.setflags(write=False)
    return StoreTable(tuple(eps), best, latency)


def measured_latency(table: StoreTable, kind: str, measured: Mapping[str, Reading]) -> np.ndarray:
    """Per GPU, the read latency of its NUMA node's store: what the host's agent measured
    (reading `read_s` under the endpoint's name) where that reading is no older than its
    `stale_after_s`, else the nominal figure; inf where the node has no such store."""
    if not measured or not table.endpoints:
        return table.latency
    per_ep: np.ndarray | None = None
    for i, e in enumerate(table.endpoints):
        r = measured.get(e.name)
        if r is None:
            continue
        v = r.values.get("read_s")
        if v is None or not math.isfinite(v) or v < 0 or r.age_s > r.values.get("stale_after_s", math.inf):
            continue
        if per_ep is None:
            per_ep = np.full(len(table.endpoints), STORE_P99[StoreKind(kind)])
        per_ep[i] = v
    if per_ep is None:
        return table.latency
    out = np.where(np.isfinite(table.latency), per_ep[table.best] if len(table.best) else table.latency, np.inf)
    out.setflags(write=False)
    return out


__all__ = ["LOCAL_STORE_KINDS", "STORE_P99", "StoreTable", "is_local_store", "measured_latency", "store_table"]
