"""The end-to-end demo (`policyc demo`) on the real data plane.

It compiles `policies/` (the demo is the one place outside the compiler's own commands
that reads contract source: the runtime it starts reads the bundle only). Where root and
network namespaces are available it runs on a fleet of namespace hosts, each with its TPM
and its agent starting and registering the real model servers (`host_fleet.py`);
elsewhere it says so in one line and serves the decision service on the simulated
cluster, starts a small pool of real KServe model servers on loopback and registers them
with their ONNX models and endpoints beside the simulated fleet. Either way it puts a real
Envoy in front of them with policyc as its endpoint picker,
and then plays the scenes as real HTTP/2 traffic through Envoy: real inference answers,
refusals with their reasons, a congestion event that moves traffic, a request stalled on
its model server broken at its budget and answered by the backup's simplified variant;
then the decision API's own scenes (dependency binding, sessions, a typed request the
solver rejects), a self-heal in dry run, an `Explain`, and the audit log verified and
reported.
"""

from __future__ import annotations

import contextlib
import json
import signal
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Iterator, TextIO


import policyc
from policyc.client import operator_channel
from policyc.cluster.netns_agents import unavailable
from policyc.placer import Refresher, SimulatedCluster
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.gateway.bootstrap import POOL_CLUSTER
from policyc.modelserver import wire
from policyc.modelserver.client import Answer
from policyc.modelserver.launcher import ModelPool
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, ServeConfig
from policyc.server.proto import pb_grpc

from . import decision_scenes, fleet_scene, host_fleet
from policyc.gateway.runner import Gateway

from .gateway_up import start_gateway
from .host_fleet import HostFleet, HostPool
from .llm_scene import LlmScene
from .model_pool import RealInstance, plan, start_pool
from .narration import DemoError, Narrator
from .traffic import HTTP_OF, Outcome, Traffic

POLICIES = Path(policyc.__file__).resolve().parent / "policies"
POOL_STATS = f"cluster.{POOL_CLUSTER}."

FLEETS = ("auto", "hosts", "simulated")
CONGESTED = {"X-Tenant": "first-federal", "X-Model": "fraud-scorer", "X-Data-Region": "us-west"}  # the congestion scene's request

__all__ = ["DemoError", "FLEETS", "run_demo"]


class Demo:
    def __init__(self, out: TextIO, workdir: Path, fleet: str = "auto") -> None:
        if fleet not in FLEETS:
            raise ValueError(f"fleet `{fleet}`: one of {', '.join(FLEETS)}")
        self.fleet = fleet
        self.say = Narrator(out)
        self.dir = workdir.absolute()  # Envoy takes only absolute paths (the picker's Unix socket under it)
        self.started = time.monotonic()

    def run(self) -> int:
        llm = LlmScene(self.say, self.dir)
        llm.start_vllm()  # ~70 s to serve: it starts while the other scenes run, and its scene is the last
        try:
            self._scenes()
            llm.run()
        finally:
            llm.stop()
        self.say.say(f"\ndemo finished in {time.monotonic() - self.started:.1f} s: gateway, model servers and decision "
                     "service stopped, audit log verified")
        return 0

    def _scenes(self) -> None:
        why = "asked for (--fleet simulated)" if self.fleet == "simulated" else unavailable()
        if why and self.fleet == "hosts":
            raise DemoError(f"--fleet hosts: no namespace fleet on this machine: {why}")
        if self.fleet == "simulated":
            self.say.say("fleet: the simulated cluster, as asked (--fleet simulated)")
        elif why:
            self.say.say(f"fleet: falling back to the simulated cluster, no namespace fleet here: {why}")
        else:
            self.say.say("fleet: hosts as network namespaces on this machine, each with its own TPM, agent and model servers")
        bundle = self._compile()
        audit_path = self.dir / "audit.db"
        if why:
            self._on_simulated(bundle, audit_path)
        else:
            self._on_hosts(bundle, audit_path)
        self._audit(audit_path)

    def _on_simulated(self, bundle: Bundle, audit_path: Path) -> None:
        """The real model servers on loopback, on slots of the simulated cluster."""
        self.say.head("serve the decision service on the simulated cluster")
        server = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(), audit_log=audit_path, settle_heap=True))
        thread = ServerThread(server)
        port = thread.start()
        assert server.cluster is not None
        slots = server.cluster.gpu_slots()
        self.say.say(f"listening on 127.0.0.1:{port}; {len(slots)} GPUs on {ClusterSpec().hosts} hosts; "
                     f"audit log {audit_path.name}")
        snap = server.refresher.current()
        real = plan(bundle, slots, lambda s: float(snap.gpu_free[snap.topology.gpu_index[(s.host, s.gpu)]]))
        pool: ModelPool | None = None
        gateway: Gateway | None = None
        try:
            with operator_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.DecisionsStub(channel)
                pool = self._pool(bundle, real)
                self.say.head("register the fleet over gRPC")
                fleet_scene.register_simulated(self.say, stub, bundle, slots, real)
                fleet_scene.refuse_broken_onnx(self.say, stub, bundle, real[0])
                self.say.say(f"{len(real)} real instances, each with the ONNX model it serves and its endpoint:")
                fleet_scene.register_real(self.say, stub, pool, real)
                gateway = self._gateway(thread, pool)
                traffic = Traffic(self.say, gateway.options.listen)
                try:
                    self._mix(traffic)
                    self._congestion(traffic, server, real)
                    self._budget_break(traffic, gateway, pool, real, server)
                finally:
                    traffic.close()
                self._decision_api(stub, server)
        finally:
            if gateway is not None:
                gateway.stop()
            if pool is not None:
                pool.stop()
            thread.stop()

    def _on_hosts(self, bundle: Bundle, audit_path: Path) -> None:
        """The real model servers on namespace hosts, started and registered by each host's
        agent; the rest of the topology simulated (see `host_fleet.py`)."""
        spec = ClusterSpec()
        cluster = SimulatedCluster(spec.seed, spec.hosts, spec.gpus_per_host, hosts_per_rack=spec.hosts_per_rack)
        slots = cluster.gpu_slots()
        first = Refresher(cluster, 0.2)  # the first tick, as the decision service will see it (same seed)
        snap = first.current()
        real = host_fleet.plan(bundle, slots, lambda s: float(snap.gpu_free[snap.topology.gpu_index[(s.host, s.gpu)]]))
        hosts = HostFleet(self.say, self.dir, bundle, real)
        self.say.head(f"bring up {len(hosts.names)} hosts: {', '.join(hosts.names)} (names of the topology's hosts)")
        thread: ServerThread | None = None
        gateway: Gateway | None = None
        try:
            cfg = hosts.start()
            self.say.head("serve the decision service: a replica on the hosts' etcd")
            server = DecisionServer(bundle, ServeConfig(cluster=spec, audit_log=audit_path, settle_heap=True, fleet=cfg))
            thread = ServerThread(server)
            port = thread.start()
            self.say.say(f"listening on 127.0.0.1:{port}; the topology: {len(slots)} GPUs on {spec.hosts} hosts, "
                         f"{len(hosts.names)} of them the namespace hosts, the rest simulated; audit log {audit_path.name}")
            self.say.head("enroll each host's TPM key, start each host's agent with its model servers")
            hosts.enroll()
            pool = hosts.run_agents(server)
            assert pool.startup_s is not None
            self.say.say(f"{len(pool.instances)} KServe model servers (ONNX with onnxruntime) serving on their hosts' "
                         f"addresses and registered by their agents {pool.startup_s:.1f} s after the agents started; "
                         "where each fact comes from:")
            hosts.facts(server, pool)
            with operator_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.DecisionsStub(channel)
                self.say.head("register the simulated rest of the fleet over gRPC")
                simulated, left_out = host_fleet.simulated_slots(slots, set(hosts.names))
                fleet_scene.register_simulated(self.say, stub, bundle, simulated, real)
                self.say.say(f"  (the {left_out} GPUs of simulated hosts with a TPM take none: no TPM there to quote, and this "
                             "fleet trusts a TPM fact only as attested)")
                fleet_scene.refuse_broken_onnx(self.say, stub, bundle, real[0])
                gateway = self._gateway(thread, pool)
                traffic = Traffic(self.say, gateway.options.listen)
                try:
                    self._mix(traffic)
                    self._congestion_on_hosts(traffic, stub, server, hosts, real)
                    self._budget_break(traffic, gateway, pool, real, server)
                finally:
                    traffic.close()
                self.say.head(f"a link fails on {hosts.names[-1]}: the heal goes to that host's own agent, under the "
                              "leader's fencing token (dry run)")
                hosts.link_failure(server)
                self._decision_api(stub, server, on_hosts=True)
        finally:
            if gateway is not None:
                gateway.stop()
            hosts.stop_agents()
            if thread is not None:
                thread.stop()
            hosts.stop()
        self.say.say(f"\nhosts torn down: agents and their model servers, TPMs, etcd, namespaces {', '.join(hosts.names)}")

    def _decision_api(self, stub: pb_grpc.DecisionsStub, server: DecisionServer, *, on_hosts: bool = False) -> None:
        self.say.head("the decision API alone: what `policyc serve` answers without a gateway")
        decision_scenes.decide_mix(self.say, stub)
        self.say.head("SM utilisation collapses on one GPU: self-heal in dry run")
        if on_hosts:  # on a simulated GPU: the simulator is what makes its SM utilisation collapse
            decision_scenes.self_heal(self.say, stub, server, {"X-Model": "recommender", "X-Data-Region": "eu-west"},
                                      "a recommender request in eu-west (a simulated host)")
        else:
            decision_scenes.self_heal(self.say, stub, server)
        self.say.head("Explain: why a healthcare request went where it went")
        decision_scenes.explain(self.say, stub)

    # ------------------------------------------------------------------ set-up scenes
    def _compile(self) -> Bundle:
        self.say.head("compile policies/")
        result = compile_paths([str(POLICIES)])
        if not result.ok or result.bundle is None:
            raise DemoError("the example policies do not compile: " + "; ".join(str(d) for d in result.errors[:3]))
        bundle_path = self.dir / "bundle.json"
        bundle_io.write(result.bundle, bundle_path)
        bundle = bundle_io.load(bundle_path)
        self.say.say(f"{len(bundle.contracts)} contracts, {len(bundle.rules)} request rules, {len(bundle.breakers)} "
                     f"breakers → {bundle_path.name} ({bundle.content_hash[:23]}…)")
        return bundle

    def _pool(self, bundle: Bundle, real: list[RealInstance]) -> ModelPool:
        self.say.head("start the model servers (KServe, ONNX with onnxruntime, OIP v2 gRPC + REST)")
        pool = start_pool(bundle, real, self.dir)
        assert pool.startup_s is not None
        self.say.say(f"{len(pool.processes)} KServe processes, {len(pool.instances)} instances, ready in "
                     f"{pool.startup_s:.1f} s (forked from one process that imported KServe once; ServerReady and ModelReady "
                     "checked on every instance's port)")
        return pool

    def _gateway(self, thread: ServerThread, pool: ModelPool | HostPool) -> Gateway:
        self.say.head("start the gateway: Envoy, with policyc as its endpoint picker (ext_proc)")
        t = time.monotonic()
        gw = start_gateway(thread, self.dir)
        assert gw.envoy is not None
        hosts = gw.envoy.cluster_hosts(POOL_CLUSTER)
        if hosts != {i.endpoint for i in pool.instances}:
            raise DemoError(f"Envoy's pool is {sorted(hosts)}, not the registered model servers")
        self.say.say(f"Envoy (pid {gw.envoy.pid}) listening on {gw.options.listen}, HTTP/2 upstream to the "
                     f"{len(hosts)} registered endpoints (its pool follows the registry); picker on "
                     f"127.0.0.1:{gw.picker.port} — up in {time.monotonic() - t:.1f} s")
        return gw

    # ------------------------------------------------------------------ traffic scenes
    def _mix(self, t: Traffic) -> None:
        self.say.head("a request mix through Envoy: real answers and refusals")
        ok = [
            t.send("the reference request", {"X-Model": "fraud-scorer-lite", "X-SLO-Latency": "150ms",
                                             "X-Data-Region": "us-west"}),
            t.send("finance: must land on TPM + memory encryption + hardware firewall",
                   {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer", "X-SLO-Latency": "200ms"}),
            t.send("healthcare: clinical notes in the EU, with TEE or memory encryption",
                   {"X-Tenant": "charite", "X-Model": "clinical-notes", "X-Data-Region": "eu-west"}),
            t.send("the recommender in us-west", {"X-Model": "recommender", "X-Data-Region": "us-west"}),
        ]
        if any(o.answer is None for o in ok):
            raise DemoError("an admissible request through the gateway got no answer")
        refused: list[tuple[Outcome, int]] = [
            (t.send("healthcare asking for a US region: a rule excludes every instance",
                    {"X-Tenant": "st-marys", "X-Model": "clinical-notes", "X-Data-Region": "us-east"}), 403),
            (t.send("the support chatbot: its instances are simulated, none has an endpoint",
                    {"X-Model": "support-chatbot"}), 503),
            (t.send("a malformed header", {"X-SLO-Latency": "fast", "X-Data-Region": "us-west"}), 400),
            (t.send("a misspelt header", {"X-Data-Regoin": "us-west"}), 400),
            (t.send("an unknown tenant", {"X-Tenant": "acme-bnak"}), 400),
        ]
        for o, status in refused:
            if o.answer is not None or HTTP_OF.get(o.code) != status:
                raise DemoError(f"expected a {status} refusal through the gateway, got {o.code.name} {o.reason}")
        status, _ = t.send_http("the misspelt header again, from an HTTP/1.1 client", {"X-Data-Regoin": "us-west"})
        if status != 400:
            raise DemoError(f"the gateway answered the misspelt header with HTTP {status}, not 400")

    def _before(self, t: Traffic) -> Answer:
        before = t.send("before", CONGESTED).answer
        if before is None:
            raise DemoError("the congestion scene needs an answered request")
        return before

    def _congestion(self, t: Traffic, server: DecisionServer, real: list[RealInstance]) -> None:
        self.say.head("congestion: the RDMA ports in front of a serving GPU climb to 89 % watermark")
        before = self._before(t)
        assert server.cluster is not None
        topo = server.cluster.topology()
        gpu = next(r.slot for r in real if r.id == before.instance)
        index = topo.gpu_keys.index(f"{gpu.host}/{gpu.gpu}")
        # both paths out of that GPU: its own NUMA node's port and the one across the socket
        ports = [topo.port_key(int(p[index])) for p in topo.gpu_ports if p[index] >= 0]
        for port in ports:
            server.cluster.watermark(port, 0.89)
        server.refresher.tick()
        self.say.say(f"\n  event: {', '.join(ports)} (the RDMA ports in front of {gpu.host}/{gpu.gpu}) pinned at 89 % "
                     f"watermark (collector tick {server.refresher.current().version})")
        after = t.send("after", CONGESTED).answer
        if after is None or after.instance == before.instance:
            raise DemoError(f"traffic did not move off the congested ports ({after.instance if after else 'no answer'})")
        self.say.say(f"  traffic moved: `{before.instance}` → `{after.instance}` (another host, other RDMA ports)")
        for port in ports:
            server.cluster.clear(port)
        server.refresher.tick()

    def _congestion_on_hosts(self, t: Traffic, stub: pb_grpc.DecisionsStub, server: DecisionServer, hosts: HostFleet,
                             real: list[RealInstance]) -> None:
        self.say.head("congestion: the uplink of the host serving finance traffic fills up (real tc, measured by its agent)")
        before = self._before(t)
        host = next(r.slot.host for r in real if r.id == before.instance)
        moved: list[str] = []

        def while_shaped(seconds: float, fill: float, why: list[str]) -> None:
            self.say.say(f"  placements moved off {host} {seconds * 1e3:.0f} ms after the tc command; {host}'s agent measured "
                         f"its eth0 queue {fill:.0%} full in its latest report (root qdisc backlog over its limit, published "
                         "every tick; the placer's last tick may have read an earlier, emptier one: a partly full queue "
                         "adds its buffer delay to the prediction, over 80 % refuses the host)")
            for line in why:
                self.say.say(f"  Explain: {line}")
            after = t.send("after", CONGESTED).answer
            if after is None or after.instance == before.instance:
                raise DemoError(f"traffic did not move off the congested host ({after.instance if after else 'no answer'})")
            moved.append(after.instance)
        hosts.congestion(stub, server, host, CONGESTED, while_shaped)
        other = next(r.slot.host for r in real if r.id == moved[0])
        self.say.say(f"  traffic moved: `{before.instance}` → `{moved[0]}` ({other}, another host, another uplink)")
        self.say.say(f"  shaping removed and the flood stopped: {host}'s agent reports its queue empty again after "
                     f"{hosts.drained(server, host):.1f} s")

    def _budget_break(self, t: Traffic, gw: Gateway, pool: ModelPool | HostPool, real: list[RealInstance],
                      server: DecisionServer) -> None:
        self.say.head("a request stalls on its model server: broken at its budget, answered by the backup")
        primaries = [r.id for r in real if r.role == "primary"]
        cancelled_before = {i: _metric(pool.instance(i).http_endpoint, "policyc_modelserver_cancelled_total", i)
                            for i in primaries}
        assert gw.envoy is not None
        envoy_before = gw.envoy.stats(POOL_STATS)
        slots = {r.id: r.slot for r in real}
        snap = server.refresher.current()
        score_before = {i: snap.gpu_score(slots[i].host, slots[i].gpu) for i in primaries}
        o = t.send("finance request to fraud-scorer; its model server is told to hold it 3 s",
                   {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"}, extra={wire.STALL_MS: "3000"})
        a = o.answer
        if a is None or a.variant != wire.SIMPLIFIED or a.retry_count != 1:
            raise DemoError(f"the stalled request was not answered by the backup's simplified variant ({o.code.name} {o.reason})")
        if o.elapsed_s >= 3.0:
            raise DemoError(f"the stalled request waited out its stall ({o.elapsed_s:.1f} s): no budget break")
        reset = [i for i in primaries
                 if _metric(pool.instance(i).http_endpoint, "policyc_modelserver_cancelled_total", i) > cancelled_before[i]]
        self.say.say(f"  model server of {', '.join(f'`{i}`' for i in reset) or '?'}: 1 stream reset by Envoy while held "
                     "(policyc_modelserver_cancelled_total)")
        envoy = {k.removeprefix(POOL_STATS): v - envoy_before.get(k, 0) for k, v in gw.envoy.stats(POOL_STATS).items()}
        self.say.say("  Envoy upstream: " + ", ".join(f"{k} +{envoy.get(k, 0)}" for k in (
            "upstream_rq_per_try_timeout", "upstream_rq_retry", "upstream_rq_tx_reset", "upstream_cx_destroy")))
        if len(reset) != 1 or envoy.get("upstream_rq_per_try_timeout", 0) < 1:
            raise DemoError("the stalled stream was not reset at its budget")
        self.say.say(f"  the backup saw {wire.RETRY_COUNT}: {a.headers.get(wire.RETRY_SEEN, '?')} and answered with "
                     f"its {a.variant} variant in {a.compute_us} µs")
        records = gw.picker.acts.of(a.decision_id, 3, timeout=5)  # learnt from Envoy's access log, one flush later
        for r in records:
            self.say.say(f"  action: {r.kind:<15} {r.target:<40} {r.outcome:<8} {r.detail}")
        if {r.kind for r in records} != {"cancel_stream", "redirect", "report_anomaly"}:
            raise DemoError("the gateway did not record the break, the redirect and the anomaly")
        broken = slots[reset[0]]
        before = score_before[reset[0]]
        after = server.refresher.tick().gpu_score(broken.host, broken.gpu)
        self.say.say(f"  placer: {broken.host}/{broken.gpu} score {before:.3f} before the request → {after:.3f} on the "
                     "next tick (the reported anomaly lowered its health)")
        if not after < before:
            raise DemoError("the reported anomaly did not lower the GPU's score")

    # ------------------------------------------------------------------ audit
    def _audit(self, audit_path: Path) -> None:
        self.say.head("audit: verify and report")
        from policyc.cli.main import main as cli

        rc = cli(["audit", "verify", "--log", str(audit_path)])
        if rc != 0:
            raise DemoError(f"audit verify failed (exit {rc})")
        rc = cli(["audit", "report", "--log", str(audit_path), "--by", "model"])
        if rc != 0:
            raise DemoError(f"audit report failed (exit {rc})")
        self._per_call(audit_path)

    def _per_call(self, audit_path: Path) -> None:
        """Every call through the gateway: its measured network bytes and compute seconds,
        from its `accounting` record (Envoy's access log, the model server's own time)."""
        from policyc.audit.query import AuditReader
        from policyc.audit.records import ActionRecord, EntryKind

        calls: list[ActionRecord] = []
        with AuditReader.open(audit_path) as reader:
            after = 0
            while page := reader.entries(kind=EntryKind.ACTION, after_seq=after):
                after = page[-1].seq
                calls += [e.record for e in page if isinstance(e.record, ActionRecord) and e.record.kind == "accounting"
                          and e.record.decision_id is not None]
        answered = [c for c in calls if json.loads(c.detail).get("downstream", {}).get("grpc_status") == "0"]
        net = [c.resources.network_bytes.value for c in answered if c.resources and c.resources.network_bytes]
        cpu = [c.resources.compute_seconds.value for c in answered if c.resources and c.resources.compute_seconds]
        if not answered or len(net) != len(answered) or len(cpu) != len(answered) or min(net) <= 0 or min(cpu) <= 0:
            raise DemoError(f"{len(answered)} answered calls through the gateway, {len(net)} with measured network bytes and "
                            f"{len(cpu)} with measured compute seconds: every answered call must have both, non-zero")
        self.say.say(f"measured per call through the gateway: {len(answered)} answered calls, network {min(net) / 1e6:.4f}-"
                     f"{max(net) / 1e6:.4f} MB and compute {min(cpu) * 1e3:.3f}-{max(cpu) * 1e3:.3f} ms each "
                     "(Envoy's access log; the model server's own time on its CPU; GPU-seconds: none measured)"
                     + (f"; {len(calls) - len(answered)} not answered by a model server" if len(calls) > len(answered) else ""))


def _metric(http_endpoint: str, name: str, instance: str) -> float:
    with urllib.request.urlopen(f"http://{http_endpoint}/metrics", timeout=5) as r:  # noqa: S310 - loopback
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") and f'instance="{instance}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def run_demo(out: TextIO, workdir: Path | None = None, fleet: str = "auto") -> int:
    """Run the demo in `workdir` (a fresh temporary directory when None); 0 on success.
    `fleet`: "hosts" (namespace hosts with agents; an error where this machine has none),
    "simulated", or "auto" (hosts where root and network namespaces are available)."""
    with _terminated_as_interrupt():
        if workdir is not None:
            return Demo(out, workdir, fleet).run()
        with tempfile.TemporaryDirectory(prefix="policyc-demo-") as tmp:
            return Demo(out, Path(tmp), fleet).run()


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every `finally` tears down what the demo started
    (namespaces, agents, model servers, Envoy) instead of the process vanishing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(sig: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {sig}")
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
