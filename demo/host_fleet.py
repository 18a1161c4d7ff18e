"""The demo on a fleet of hosts (where root and network namespaces are available): three
hosts as network namespaces on a bridge (`cluster/netns_agents.py`), each with its own
software TPM whose key the operator enrolled, and its own `policyc agent run`, which starts
the host's KServe model servers on the host's own address, supervises them and registers
their instances; the decision service (a replica on a one-member etcd), the gateway and
Envoy in the root namespace.

Where each fact of a real instance comes from, as the narration says: its endpoint's
address and the host's interfaces are what the host's agent discovered in its namespace
(rtnetlink); its `tpm` fact counts only once the leader verified a quote of that host's TPM
against the enrolled key; its port congestion is the qdisc backlog its agent measures every
tick; its GPU, NUMA node, region and other hardening facts are the simulated topology's for
that host name (a namespace has no GPU). The other hosts of the topology stay simulated,
for placement at scale: their instances have no endpoint and, having no TPM to quote, claim
none (a fleet with enrolled hosts trusts a TPM fact only as attested).

The congestion scene is real: the uplink (eth0) of the host serving the request is shaped
with `tc` and flooded, its agent measures the queue, and placements move off it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc

from policyc.cluster.config import FleetConfig
from policyc.cluster.host_signals import backlog_fraction
from policyc.cluster.netns_agents import PCRS, AgentFleet, NetnsError
from policyc.cluster.link_heal import RULE as LINK_RULE
from policyc.cluster.store import StoreError
from policyc.enforcer.records import ActionRecord, Outcome
from policyc.compiler.bundle import Bundle
from policyc.modelserver.oip import InferenceStub, pb as oip
from policyc.modelserver.specs import InstanceSpec, ServerSpec, ServingInstance
from policyc.placer.topology import GpuSlot
from policyc.server.app import DecisionServer
from policyc.server.proto import pb, pb_grpc

from .model_pool import RealInstance, model_files, pick_slot, retried_here
from .narration import DemoError, Narrator

HTTP_PORT, GRPC_PORT = 8000, 9000  # per host: each host is its own network stack, so fixed ports never clash
READY_TIMEOUT_S = 120.0  # five KServe processes importing on a loaded 2-core machine
MOVE_TIMEOUT_S = 30.0
DATA_LINK = "data0"
LINK_TIMEOUT_S = 30.0
SHAPED_RATE = "256kbit"
FULL = 0.8  # the placer's port watermark limit (`Thresholds.max_port_watermark`): a fuller queue refuses its GPUs
# a host's flood: UDP to the bridge's address (nothing listens; the packets queue on the shaped uplink first)
FLOOD = ("import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\nwhile True:\n"
         "    try: s.sendto(b'x'*1400,(sys.argv[1],9))\n    except OSError: pass\n    time.sleep(0.002)\n")


def plan(bundle: Bundle, slots: tuple[GpuSlot, ...], rank: Callable[[GpuSlot], float]) -> list[RealInstance]:
    """The demo's five real instances on three hosts, each on its own GPU: two
    finance-hardened us-west hosts with a `fraud-scorer` primary each (the congestion scene
    moves traffic from one to the other), the first also with the `fraud-scorer-lite`
    backup, the second with the recommender; an eu-west host with clinical notes. One
    model-server process per instance (the agent registers one instance per server).
    Slots are tried in `rank` order, highest first (the free GPU share now, as a scheduler
    places serving replicas where there is room)."""
    slots = tuple(sorted(slots, key=lambda s: -rank(s)))
    a = pick_slot(bundle, slots, "fraud-scorer", region="us-west", finance=True, avoid_hosts=set())
    b = pick_slot(bundle, slots, "fraud-scorer", region="us-west", finance=True, avoid_hosts={a.host})
    c = pick_slot(bundle, slots, "clinical-notes", region="eu-west", avoid_hosts={a.host, b.host})

    def beside(s: GpuSlot, model: str) -> GpuSlot:
        return pick_slot(bundle, tuple(x for x in slots if x.host == s.host and x.gpu != s.gpu), model, avoid_hosts=set())
    from policyc.server.fleet import instance_id

    placed = [(a, "fraud-scorer", "primary"), (beside(a, "fraud-scorer-lite"), "fraud-scorer-lite", "backup"),
              (b, "fraud-scorer", "primary"), (beside(b, "recommender"), "recommender", "serving"),
              (c, "clinical-notes", "serving")]
    return [RealInstance(instance_id(m, s.host, s.gpu), m, s, role, n) for n, (s, m, role) in enumerate(placed)]


def simulated_slots(slots: tuple[GpuSlot, ...], hosts: set[str]) -> tuple[tuple[GpuSlot, ...], int]:
    """The GPUs of the topology's other hosts that take simulated instances (placement at
    scale, no endpoint), and how many were left out: those of hosts the topology gives a
    TPM, since none of them has a TPM to quote and a fleet with enrolled hosts trusts a TPM
    fact only as attested (the registration would be refused)."""
    others = [s for s in slots if s.host not in hosts]
    kept = tuple(s for s in others if not s.tpm)
    return kept, len(others) - len(kept)


@dataclass
class HostPool:
    """The real instances as their hosts' agents run them: what the scenes need of each
    (endpoint, REST endpoint, model file, variants), read from each server's ready file."""

    real: list[RealInstance]
    ready_files: dict[str, Path]  # instance id -> its server's ready file
    models: dict[str, Path]  # instance id -> its full model file
    instances: list[ServingInstance] = dataclasses.field(default_factory=list)
    startup_s: float | None = None

    def instance(self, instance_id: str) -> ServingInstance:
        for i in self.instances:
            if i.instance_id == instance_id:
                return i
        raise KeyError(f"no instance `{instance_id}` on the hosts")

    def wait(self, registered: Callable[[str], bool], started: float, logs: Callable[[str], str]) -> None:
        """Every server serving (its ready file, ServerReady and ModelReady over gRPC from the
        root namespace) and every instance in the decision service's registry."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        for r in self.real:
            while not self.ready_files[r.id].exists():
                if time.monotonic() > deadline:
                    raise DemoError(f"the model server of `{r.id}` on {r.slot.host} is not serving after "
                                    f"{READY_TIMEOUT_S:g} s: {logs(r.id)}")
                time.sleep(0.05)
            served = _serving(self.ready_files[r.id], self.models[r.id])
            _check_ready(served, deadline)
            while not registered(r.id):
                if time.monotonic() > deadline:
                    raise DemoError(f"`{r.id}` is serving but its agent's registration did not reach the decision service")
                time.sleep(0.05)
            self.instances.append(served)
        self.startup_s = time.monotonic() - started


def _serving(ready: Path, model: Path) -> ServingInstance:
    facts = json.loads(ready.read_text())
    (inst,) = facts["instances"]
    http = f"{facts['host']}:{facts['http_port']}"
    return ServingInstance(instance_id=str(inst["instance"]), model=str(inst["model"]), contract=str(inst["contract"]),
                           endpoint=f"{facts['host']}:{inst['grpc_port']}", http_endpoint=http, model_path=model,
                           variants=tuple(inst["variants"]), aliases=tuple(inst["aliases"]),
                           on_rest=str(inst["model"]) in facts["rest_models"])


def _check_ready(served: ServingInstance, deadline: float) -> None:
    names = [served.model, *served.aliases]
    with grpc.insecure_channel(served.endpoint) as channel:
        stub = InferenceStub(channel)
        while True:
            try:
                if stub.ServerReady(oip.ServerReadyRequest(), timeout=5).ready and all(
                        stub.ModelReady(oip.ModelReadyRequest(name=n), timeout=5).ready for n in names):
                    return
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    raise DemoError(f"model server at {served.endpoint} not ready: {e.code().name} {e.details()}") from None
            if time.monotonic() > deadline:
                raise DemoError(f"model server at {served.endpoint} reports not ready")
            time.sleep(0.05)


class HostFleet:
    """The namespace hosts, their agents and their model servers, for `demo/run.py`."""

    def __init__(self, say: Narrator, workdir: Path, bundle: Bundle, real: list[RealInstance]) -> None:
        self.say, self.dir, self.bundle, self.real = say, workdir, bundle, real
        self.names = tuple(dict.fromkeys(r.slot.host for r in real))
        self.hosts: AgentFleet | None = None

    def start(self) -> FleetConfig:
        """Namespaces, etcd, the TPMs with their keys; the decision service's fleet config."""
        t = time.monotonic()
        try:
            self.hosts = AgentFleet.start(self.names, self.dir / "hosts")
        except (RuntimeError, OSError, ValueError) as e:  # NetnsError, TpmError, etcd or swtpm that did not start
            raise DemoError(f"bringing up the hosts: {e}") from None
        f = self.hosts.fleet
        try:  # the link-failure scene's cable, up before the host's agent first reports (it heals links it saw up)
            f.add_link(self.names[-1], DATA_LINK)
        except NetnsError as e:
            raise DemoError(f"bringing up the hosts: {e}") from None
        self.say.say(f"{len(self.names)} hosts as network namespaces on bridge {f.bridge} ({f.network}; the root namespace "
                     f"is {f.gateway}), etcd on {self.hosts.etcd_url}, a software TPM (swtpm) inside each host with its "
                     f"attestation key made there, a second link {DATA_LINK} on {self.names[-1]} — "
                     f"{time.monotonic() - t:.1f} s")
        return FleetConfig(etcd=tuple(self.hosts.etcd.endpoints), name="demo", prefix=self.hosts.prefix, lease_ttl=5,
                           report_interval=0.5)

    def enroll(self) -> None:
        assert self.hosts is not None
        try:
            enrolled = self.hosts.enroll()
        except (StoreError, OSError, ValueError) as e:  # ValueError: AttestationError, a key that is not one
            raise DemoError(f"enrolling the hosts' TPM keys: {e}") from None
        for host, name in enrolled.items():
            self.say.say(f"  operator: `policyc agent enroll --host {host}` — key {name[:16]}…, quotes must cover PCRs "
                         f"{','.join(map(str, PCRS))}")

    def run_agents(self, server: DecisionServer) -> HostPool:
        """Each host's agent, with its model servers; returns once all serve and are registered."""
        assert self.hosts is not None
        t = time.monotonic()
        files = model_files(self.bundle, self.real, self.dir)
        specs: dict[str, list[dict[str, object]]] = {}
        ready: dict[str, Path] = {}
        for r in self.real:
            on_host = specs.setdefault(r.slot.host, [])
            address = self.hosts.fleet.hosts[r.slot.host].address
            port = len(on_host)
            f = files[r.model]
            backup = r.role == "backup"
            ready[r.id] = self.dir / "servers" / f"server-{r.process}" / "ready.json"
            ready[r.id].parent.mkdir(parents=True, exist_ok=True)
            argv = ServerSpec((InstanceSpec(r.id, f.full, f.simplified if backup else None, name=r.model,
                                            aliases=retried_here(self.bundle, r.model) if backup else ()),),
                              stall_control=r.role == "primary", host=address).argv(ready[r.id])
            argv[argv.index("--grpc-port") + 1] = str(GRPC_PORT + port)
            argv[argv.index("--http-port") + 1] = str(HTTP_PORT + port)
            node = r.slot.numa_node if Path(f"/sys/devices/system/node/node{r.slot.numa_node}").exists() else 0
            on_host.append({"name": f"kserve-{r.process}", "argv": argv, "numa_node": node,
                            "env": {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                            "instance": r.instance(f"{address}:{GRPC_PORT + port}").model_dump(mode="json")})
        paths = {}
        for host, entries in specs.items():
            paths[host] = self.dir / "hosts" / f"{host}-servers.json"
            paths[host].write_text(json.dumps(entries, indent=1))
        site = {r.slot.host: ["--region", r.slot.region, "--hardware-firewall", str(r.slot.hardware_firewall).lower()]
                for r in self.real}  # the operator's site facts, as a host's agent config gives them
        if Path("/dev/nvidiactl").exists():  # this machine's GPUs are no namespace host's own: the topology's stand
            site = {h: [*f, "--no-hardware-facts"] for h, f in site.items()}
        try:
            self.hosts.run_agents(paths, flags=site)
        except RuntimeError as e:
            raise DemoError(str(e)) from None
        for host, h in self.hosts.hosts.items():
            pid = h.agent.pid if h.agent is not None else 0
            self.say.say(f"  {host}: `policyc agent run` (pid {pid}) in namespace {self.hosts.fleet.hosts[host].netns}, "
                         f"{len(specs.get(host, []))} model server(s) to start, pin and register")
        pool = HostPool(self.real, ready, {r.id: files[r.model].full for r in self.real})
        registry = server.state.registry
        pool.wait(lambda iid: iid in registry, t, self._server_log)
        return pool

    def _server_log(self, instance_id: str) -> str:
        r = next(x for x in self.real if x.id == instance_id)
        log = self.dir / "hosts" / "agents" / f"{r.slot.host}-servers" / f"kserve-{r.process}.log"
        try:
            return " | ".join(log.read_text(errors="replace").splitlines()[-6:]) or "(empty log)"
        except OSError:
            return "(no log yet)"

    def facts(self, server: DecisionServer, pool: HostPool) -> None:
        """Each real instance and where each of its facts came from."""
        replica = server.replica
        assert replica is not None and self.hosts is not None
        for host in self.names:
            found = replica.host_facts.get(host)
            att = replica.attestation.attested(host)
            ifs = ", ".join(f"{i.name} {'/'.join(a for a in i.addresses if ':' not in a)}" for i in found.interfaces
                            if i.name != "lo") if found is not None else "none reported"
            hw = found.hardware if found is not None else None
            if hw is not None:
                gpus = (f"GPUs {', '.join(g.id for g in hw.gpus)} ({hw.sources.get('gpus', 'NVML')})" if hw.gpus is not None
                        else "no GPU facts (no NVML here)")
                self.say.say(f"  {host}: region {hw.site.region}, hardware firewall {str(hw.site.hardware_firewall).lower()} "
                             f"({hw.sources.get('site.region', 'the agent configuration')}); {gpus}")
            self.say.say(f"  {host}: interfaces {ifs} (its agent: {found.source if found else '-'}); TPM "
                         + (f"attested — quote over PCRs {','.join(map(str, sorted(att.pcrs)))} verified by "
                            f"replica `{att.verified_by}` (the leader) against the enrolled key {att.ak_name[:16]}…"
                            if att is not None else "not attested"))
        for r in self.real:
            served = pool.instance(r.id)
            inst = server.state.registry.get(r.id)
            d = inst.deployment
            extra = f", {'/'.join(served.variants)} variants, also answers {', '.join(served.aliases)}" if served.aliases else ""
            self.say.say(f"  `{r.id}` ({r.role}) → {served.endpoint}{extra}, registered by {r.slot.host}'s agent: endpoint on "
                         f"the host's discovered address; tpm {d.tpm} (attested); region {d.region} and firewall "
                         f"{d.hardware_firewall} (checked against the operator's site facts); {d.gpu_model} {d.gpu}, NUMA "
                         f"{d.numa_node}, memory encryption {d.memory_encryption} (simulated topology: a namespace has no GPU)")

    # ------------------------------------------------------------------ the congestion scene
    def congestion(self, stub: pb_grpc.DecisionsStub, server: DecisionServer, host: str, headers: dict[str, str],
                   while_shaped: Callable[[float, float, list[str]], None]) -> None:
        """Shape `host`'s uplink and flood it until its agent reports the queue full (over
        `FULL`: the placer refuses a GPU whose every port is that full) and a decision for
        `headers` is placed on another host; then `while_shaped(seconds from the tc
        command's return to that decision, the queue's fill its agent measured, what
        Explain says of `host`'s GPUs)`, still shaped; then the shaping is undone."""
        assert self.hosts is not None and server.replica is not None
        fleet = self.hosts.fleet
        flood = fleet.popen(host, [sys.executable, "-c", FLOOD, fleet.gateway], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
        try:
            # 256 kbit/s: a flood that gets little CPU on a loaded machine still fills the queue
            try:
                fleet.shape_uplink(host, rate=SHAPED_RATE, spare_dports=[self.hosts.etcd.members[0].client_port])
            except NetnsError as e:
                raise DemoError(f"shaping {host}'s uplink: {e}") from None
            t0 = time.monotonic()
            self.say.say(f"\n  event: {host}'s uplink eth0 shaped with tc (HTB {SHAPED_RATE}, a 100 kB fifo; its etcd traffic "
                         "in a class of its own) and flooded from inside the host")
            req = pb.DecideRequest(headers=headers)
            while time.monotonic() - t0 < MOVE_TIMEOUT_S:
                fill = self.fill(server, host)
                if fill >= FULL:  # asked with Explain: the placement it would make, no GPU share reserved by asking
                    told = [ln.strip() for ln in stub.Explain(req, timeout=30).narrative]
                    chosen = next((ln.rsplit(" on ", 1)[1] for ln in told if ln.startswith("admitted: ")), "")
                    if chosen and not chosen.startswith(f"{host}/"):
                        # the placer's choice, and what it says of the shaped host's GPUs (refused by the measured
                        # backlog; or not among the candidates at all, their score already lowered by it)
                        while_shaped(time.monotonic() - t0, fill,
                                     [ln for ln in told if ln.startswith("placer: chose") or f"{host}/" in ln])
                        return
                time.sleep(0.1)
            raise DemoError(f"placements did not move off {host} within {MOVE_TIMEOUT_S:g} s of shaping its uplink "
                            f"(its queue {self.fill(server, host):.0%} full in its agent's latest report)")
        finally:
            flood.terminate()
            flood.wait(10)
            fleet.unshape_uplink(host)

    # ------------------------------------------------------------------ the link-failure scene
    def link_failure(self, server: DecisionServer) -> str:
        """Take the second link of the last host down inside its namespace; its agent measures
        it down, the fenced leader plans the heal and sends it to that host's agent, which
        answers (dry run, the default: what it would do). Then the cable is put back. Returns
        the host."""
        assert self.hosts is not None and server.actions is not None
        host, records = self.names[-1], server.actions.memory.records
        seen = len(records)
        self.hosts.fleet.set_link(host, DATA_LINK, up=False)
        t0 = time.monotonic()
        self.say.say(f"\n  event: {host}'s link {DATA_LINK} taken down inside its namespace (its eth0, the management "
                     "network, stays up)")

        def answered() -> list[ActionRecord]:
            return [r for r in list(records)[seen:] if r.source == f"agent {host}"]
        try:
            while not answered():
                if time.monotonic() - t0 > LINK_TIMEOUT_S:
                    raise DemoError(f"no heal of {host}/{DATA_LINK} reached its agent within {LINK_TIMEOUT_S:g} s")
                time.sleep(0.05)
            new = list(records)[seen:]
            here = [r for r in new if r.source == "executor" and r.rule == LINK_RULE and r.outcome is not Outcome.OBSERVED]
            if here:  # run (or dry-run) by the decision service's executor itself, not sent to the host
                raise DemoError(f"the heal of {host}/{DATA_LINK} ran on the decision service's machine: {here[0].detail}")
            for r in new:
                if r.rule == LINK_RULE or r.source == f"agent {host}":
                    self.say.say(f"  action: {r.kind.value:<15} {r.target:<24} {r.outcome.value:<8} {r.detail} (source: {r.source})")
            self.say.say(f"  {host}'s agent answered {time.monotonic() - t0:.2f} s after the link went down; the decision "
                         "service's own machine ran nothing")
        finally:
            self.hosts.fleet.set_link(host, DATA_LINK, up=True)  # dry run left it down: the operator puts the cable back
        return host

    @staticmethod
    def fill(server: DecisionServer, host: str) -> float:
        assert server.replica is not None
        rep = server.replica.host_signals.reports.get(host)
        return (backlog_fraction(rep.interfaces.get("eth0", {})) or 0.0) if rep is not None else 0.0

    def drained(self, server: DecisionServer, host: str, timeout: float = 30.0) -> float:
        """Wait until `host`'s agent reports its queue empty again; the seconds it took."""
        t0 = time.monotonic()
        while self.fill(server, host) > 0.01:
            if time.monotonic() - t0 > timeout:
                raise DemoError(f"{host}'s uplink queue is still {self.fill(server, host):.0%} full {timeout:g} s after "
                                "the shaping ended")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop_agents(self) -> None:
        if self.hosts is not None:
            self.hosts.stop_agents()

    def stop(self) -> None:
        if self.hosts is not None:
            self.hosts.stop()
            self.hosts = None
