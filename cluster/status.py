"""What `policyc cluster status` shows: the store's members, the leader and its token,
the bundle in force, each replica (address, bundle, lag behind the store, lease left,
registry writes not yet settled), each host (agent up, enrolled, attested when and with
which key, or refused and why) and how much shared state there is."""

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
    unsettled: int = 0  # registry writes the store did not confirm, not settled yet


@dataclass
class HostView:
    host: str
    agent: bool  # its agent holds a live lease
    addresses: list[str]  # what its agent reports
    enrolled: str  # attestation key name ("" when not enrolled)
    attested: bool
    attested_age_s: float | None
    why: str  # when its last attestation was refused
    signals_age_s: float | None = None  # its agent's last measured report (`signals/<host>`), how old
    signals_stale: bool = False  # older than five of its periods (at least 1 s): the placer does not use it
    period_ms: float | None = None  # the agent's own collection period and jitter, as it reports them
    jitter_ms: float | None = None


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
    requests: int = 0  # request ids remembered (registry writes by id)
    hosts: list[HostView] = field(default_factory=list)

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
    hosts: dict[str, HostView] = {}

    def host(name: str) -> HostView:
        return hosts.setdefault(name, HostView(name, False, [], "", False, None, ""))
    for e in snap.entries:
        if e.key.startswith(keys.instances):
            view.instances += 1
        elif e.key.startswith(keys.sessions):
            view.sessions += 1
        elif e.key.startswith(keys.quarantines):
            view.quarantines += 1
        elif e.key.startswith(keys.anchors):
            view.anchors += 1
        elif e.key.startswith(keys.requests):
            view.requests += 1
        elif e.key.startswith(keys.signals):
            _signals_record(host(e.key[len(keys.signals):]), e.key[len(keys.signals):], e.value, now)
        elif e.key.startswith(keys.agents) or e.key.startswith(keys.enrolled_hosts) or e.key.startswith(keys.attested_facts):
            _host_record(host, keys, e.key, e.value, now)
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
                round(now - float(r.get("time", now)), 2), int(r.get("unsettled", 0))))
    view.replicas.sort(key=lambda r: r.name)
    view.hosts = sorted(hosts.values(), key=lambda h: h.host)
    return view


def _host_record(host: Any, keys: Keys, key: str, raw: bytes, now: float) -> None:
    """One agent report, enrollment or attestation record into its host's line."""
    from .attestation import AttestedFact, Enrollment
    from .host_facts import HostFacts
    from .tpm_quote import AttestationError

    try:
        if key.startswith(keys.agents):
            h = host(key[len(keys.agents):])
            h.agent = True
            facts = json.loads(raw).get("facts")
            h.addresses = sorted(HostFacts.from_json(facts).routable()) if facts else []
        elif key.startswith(keys.enrolled_hosts):
            host(key[len(keys.enrolled_hosts):]).enrolled = Enrollment.decode(key, raw).key.name.hex()
        else:
            f = AttestedFact.decode(key, raw)
            h = host(f.host)
            h.attested, h.attested_age_s, h.why = f.attested, round(now - f.time, 1), f.why
    except (ValueError, AttributeError, AttestationError):
        return


def _signals_record(h: HostView, name: str, raw: bytes, now: float) -> None:
    """A host agent's measured report into its host's line: how old, stale or not, its period."""
    from .measured_hosts import HostReport, HostSignalBook

    try:
        rep = HostReport.parse(name, raw)
    except ValueError:
        return
    age = rep.age(now)
    h.signals_age_s, h.signals_stale = round(age, 2), age > HostSignalBook().stale_after(rep)
    if "period_mean_s" in rep.agent:
        h.period_ms = round(rep.agent["period_mean_s"] * 1e3, 1)
    if "jitter_s" in rep.agent:
        h.jitter_ms = round(rep.agent["jitter_s"] * 1e3, 2)


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
        if r.unsettled:
            lines.append(f"      {r.unsettled} registry write(s) not confirmed by the store: outcome unknown until settled")
    if view.hosts:
        lines.append(f"hosts     {len(view.hosts)}")
        for h in view.hosts:
            agent = "agent up" if h.agent else "no agent"
            tpm = ("not enrolled" if not h.enrolled else
                   f"attested {h.attested_age_s:g} s ago (key {h.enrolled[:16]}…)" if h.attested else
                   f"REFUSED: {h.why}" if h.why else f"enrolled (key {h.enrolled[:16]}…), not attested yet")
            lines.append(f"  {h.host:<16} {agent:<9} {', '.join(h.addresses[:4]) or '-':<24} tpm {tpm}")
            if h.signals_age_s is not None:
                period = (f", period {h.period_ms:g} ± {h.jitter_ms:g} ms" if h.period_ms is not None and h.jitter_ms is not None
                          else "")
                lines.append(f"  {'':<16} signals {h.signals_age_s:g} s old{' (STALE: not used)' if h.signals_stale else ''}{period}")
    lines.append(f"shared    {view.instances} instance(s), {view.sessions} session(s), {view.quarantines} quarantine(s), "
                 f"{view.anchors} audit anchor(s), {view.requests} request id(s)")
    return "\n".join(lines)
