"""What `policyc cluster status` shows: the store's members, the leader and its token,
the bundle in force, each replica (address, bundle, lag behind the store, lease left),
and how much shared state there is."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .keys import Keys
from .store import FleetStore, StoreStatus


@dataclass
class ReplicaView:
    name: str
    address: str
    bundle: str
    refused_bundle: dict[str, str] | None
    applied_revision: int
    lag: int  # revisions the store is ahead of what the replica had applied at its last report
    leader: bool
    token: int
    lease: str  # lease id (hex)
    lease_ttl_left: int | None
    report_age_s: float


@dataclass
class ClusterView:
    store: str
    members: list[StoreStatus]
    revision: int
    bundle: str
    leader: str
    token: int
    replicas: list[ReplicaView] = field(default_factory=list)
    instances: int = 0
    sessions: int = 0
    quarantines: int = 0
    anchors: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def gather(store: FleetStore, keys: Keys) -> ClusterView:
    snap = await store.read_prefix(keys.prefix)
    members = await store.status()
    by_key = {e.key: e for e in snap.entries}
    leader = by_key.get(keys.leader)
    pointer = by_key.get(keys.bundle)
    view = ClusterView(store.description, members, snap.revision, pointer.value.decode() if pointer else "",
                       leader.value.decode() if leader else "", leader.create_revision if leader else 0)
    now = time.time()
    for e in snap.entries:
        if e.key.startswith(keys.instances):
            view.instances += 1
        elif e.key.startswith(keys.sessions):
            view.sessions += 1
        elif e.key.startswith(keys.quarantines):
            view.quarantines += 1
        elif e.key.startswith(keys.anchors):
            view.anchors += 1
        elif e.key.startswith(keys.replicas):
            try:
                r = json.loads(e.value)
            except ValueError:
                continue
            ttl_left = await _ttl_left(store, e.lease)
            view.replicas.append(ReplicaView(
                str(r.get("name")), str(r.get("address", "")), str(r.get("bundle", "")), r.get("refused_bundle"),
                int(r.get("applied_revision", 0)), max(0, snap.revision - int(r.get("applied_revision", 0))),
                view.leader == r.get("name"), int(r.get("token", 0)), f"{e.lease:x}", ttl_left,
                round(now - float(r.get("time", now)), 2)))
    view.replicas.sort(key=lambda r: r.name)
    return view


async def _ttl_left(store: FleetStore, lease: int) -> int | None:
    return await store.time_to_live(lease) if lease else None


def render(view: ClusterView) -> str:
    lines = [f"store     {view.store}  revision {view.revision}"]
    for m in view.members:
        role = "raft leader" if m.leader == "self" else m.leader if m.leader.startswith("unreachable") else "follower"
        lines.append(f"  member  {m.endpoint:<22} {role:<26} revision {m.revision}  term {m.raft_term}")
    lines.append(f"bundle    {view.bundle or '(none in force)'}")
    lines.append(f"leader    {view.leader or '(none)'}" + (f"  fencing token {view.token}" if view.token else ""))
    lines.append(f"replicas  {len(view.replicas)}")
    for r in view.replicas:
        mark = "*" if r.leader else " "
        same = "in force" if r.bundle == view.bundle else f"{r.bundle[:23]}… (not the bundle in force)"
        lines.append(f" {mark} {r.name:<14} {r.address:<22} bundle {same}  lag {r.lag} rev  lease {r.lease} "
                     f"ttl {r.lease_ttl_left if r.lease_ttl_left is not None else '?'} s  report {r.report_age_s:g} s ago")
        if r.refused_bundle:
            lines.append(f"      refused {str(r.refused_bundle.get('hash', ''))[:23]}…: {r.refused_bundle.get('why', '')}")
    lines.append(f"shared    {view.instances} instance(s), {view.sessions} session(s), {view.quarantines} quarantine(s), "
                 f"{view.anchors} audit anchor(s)")
    return "\n".join(lines)
