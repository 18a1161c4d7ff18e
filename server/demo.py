"""The end-to-end demo (`policyc demo`): compile `policies/`, serve on the simulated
cluster, register a realistic fleet over gRPC (ONNX models included, one refused), replay a
request mix with rejections, a congestion event, a budget break retried on the backup and
a self-heal in dry run, explain one decision, then verify and report the audit log.

Everything goes through the real server on a loopback port; the scenario only plays the
parts the server does not: the client, the model call the guardian breaks, the cluster's
scripted events.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

import grpc

import policyc
from policyc.compiler import bundle_io
from policyc.compiler.pipeline import compile_paths
from policyc.enforcer.guardian import RetryPlan
from policyc.onnxgate.contract_metadata import CONTRACT_KEY, HASH_KEY, canonical_json, contract_hash, embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer

from . import convert
from .app import DecisionServer, ServerThread
from .config import ClusterSpec, ServeConfig
from .fleet import admissible_fleet
from .proto import pb, pb_grpc
from .render import decision_text, explanation_text

POLICIES = Path(policyc.__file__).resolve().parent / "policies"


class DemoError(RuntimeError):
    """A step of the demo did not behave as the scenario says."""


class _SimulatedCall:
    """A model call in flight: network 12 + protocol 8 + runtime 140 + hardware 25 ms and
    still running (a stalled GPU). `cancel()` is what the guardian calls on its stream."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.started = time.monotonic()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


class Demo:
    def __init__(self, out: TextIO, workdir: Path) -> None:
        self.out = out
        self.dir = workdir

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def head(self, title: str) -> None:
        self.say()
        self.say(f"── {title} " + "─" * max(0, 76 - len(title)))

    # ------------------------------------------------------------------ steps
    def run(self) -> int:
        self.head("1. compile policies/")
        result = compile_paths([str(POLICIES)])
        if not result.ok:
            raise DemoError("the example policies do not compile: " + "; ".join(str(d) for d in result.errors[:3]))
        bundle_path = self.dir / "bundle.json"
        bundle_io.write(result.bundle, bundle_path)
        bundle = bundle_io.load(bundle_path)
        self.say(f"{len(bundle.contracts)} contracts, {len(bundle.rules)} request rules, {len(bundle.breakers)} breakers "
                 f"→ {bundle_path.name} ({bundle.content_hash[:23]}…)")

        self.head("2. serve on the simulated cluster")
        audit_path = self.dir / "audit.db"
        server = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(), audit_log=audit_path, settle_heap=True))
        thread = ServerThread(server)
        port = thread.start()
        sim = server.cluster
        assert sim is not None
        self.say(f"listening on 127.0.0.1:{port}; {len(sim.gpu_slots())} GPUs on {ClusterSpec().hosts} hosts; "
                 f"audit log {audit_path.name}")
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.DecisionsStub(channel)
                self._fleet(stub, server, bundle)
                self._mix(stub)
                self._congestion(stub, server)
                self._budget_break(stub, server)
                self._self_heal(stub, server)
                self._explain(stub)
        finally:
            thread.stop()
        self.head("9. audit: verify and report")
        from policyc.cli.main import main as cli

        rc = cli(["audit", "verify", "--log", str(audit_path)])
        if rc != 0:
            raise DemoError(f"audit verify failed (exit {rc})")
        rc = cli(["audit", "report", "--log", str(audit_path), "--by", "model"])
        if rc != 0:
            raise DemoError(f"audit report failed (exit {rc})")
        self.say("\ndemo finished: server stopped, audit log verified")
        return 0

    def _fleet(self, stub: pb_grpc.DecisionsStub, server: DecisionServer, bundle) -> None:  # type: ignore[no-untyped-def]
        self.head("3. register a fleet over gRPC")
        assert server.cluster is not None
        fleet = admissible_fleet(bundle, server.cluster.gpu_slots())
        t = time.perf_counter()
        for inst in fleet:
            stub.RegisterInstance(convert.register_request(inst))
        by_model: dict[str, int] = {}
        for inst in fleet:
            by_model[inst.model] = by_model.get(inst.model, 0) + 1
        self.say(f"{len(fleet)} instances in {time.perf_counter() - t:.2f} s: "
                 + ", ".join(f"{m} {n}" for m, n in sorted(by_model.items())))
        # An ONNX model carrying its contract, and one whose contract lost a required field.
        model = build_transformer(TransformerSpec(vocab=200, d_model=32, heads=2, layers=1, d_ff=64, max_len=64))
        contract = bundle.contract("fraud-scorer-lite")
        good = embed_contract(model, contract)
        slot = next(s for s in server.cluster.gpu_slots() if s.tpm and s.memory_encryption and s.hardware_firewall
                    and s.region in contract.regions)
        from policyc.matcher import Instance

        inst = Instance(id=f"fraud-scorer-lite-onnx@{slot.host}/{slot.gpu}", model="", deployment=slot.to_deployment())
        r = stub.RegisterInstance(convert.register_request(inst, onnx_model=good.SerializeToString()))
        self.say(f"ONNX model with embedded contract → registered `{r.instance_id}` as `{r.model}` ({r.registry_size} live)")
        raw = json.loads(canonical_json(contract))
        del raw["memory"]
        text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
        bad = embed_contract(model, contract)
        for p in bad.metadata_props:
            if p.key == CONTRACT_KEY:
                p.value = text
            elif p.key == HASH_KEY:
                p.value = contract_hash(text)
        try:
            stub.RegisterInstance(convert.register_request(inst.model_copy(update={"id": "broken-onnx"}),
                                                           onnx_model=bad.SerializeToString()))
            raise DemoError("an ONNX model without `memory` was registered")
        except grpc.RpcError as e:
            field = dict(e.trailing_metadata() or ()).get("policyc-field")
            self.say(f"ONNX model missing a contract section → {e.code().name}: {e.details()} [field {field}]")

    def _decide(self, stub: pb_grpc.DecisionsStub, title: str, headers: dict[str, str] | None = None,
                attributes: dict | None = None, session: str = "") -> "pb.Decision | None":  # type: ignore[type-arg]
        self.say()
        shown = ", ".join(f"{k}: {v}" for k, v in (headers or {}).items())
        if attributes:
            shown += (", " if shown else "") + ", ".join(f"{k}={v} (typed)" for k, v in attributes.items())
        if session:
            shown += (", " if shown else "") + f"session {session}"
        self.say(f"▶ {title}  [{shown}]")
        try:
            d = stub.Decide(pb.DecideRequest(headers=headers or {}, attributes=convert.attributes_msg(attributes or {}),
                                             session_id=session))
        except grpc.RpcError as e:
            self.say(f"{e.code().name}  {e.details()}")
            return None
        self.say(decision_text(d))
        return d

    def _mix(self, stub: pb_grpc.DecisionsStub) -> None:
        self.head("4. a request mix")
        self._decide(stub, "the reference request", {"X-SLO-Latency": "150ms", "X-Data-Region": "us-west"})
        self._decide(stub, "finance: must land on TPM + memory encryption + hardware firewall",
                     {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer", "X-SLO-Latency": "200ms"})
        self._decide(stub, "healthcare: clinical notes in the EU, with TEE or memory encryption",
                     {"X-Tenant": "charite", "X-Model": "clinical-notes", "X-Data-Region": "eu-west"})
        self._decide(stub, "the recommender: its declared catalog API bound to the region's HTTP tier",
                     {"X-Model": "recommender", "X-Data-Region": "us-west"})
        self._decide(stub, "a support-chatbot session: state read from the NVMe on the GPU's NUMA node",
                     {"X-Model": "support-chatbot"}, session="conv-7")
        self._decide(stub, "healthcare asking for a US region: no instance may serve it",
                     {"X-Tenant": "st-marys", "X-Data-Region": "us-east"})
        self._decide(stub, "clinical notes pinned to eu-central, the other EU region",
                     {"X-Tenant": "charite", "X-Model": "clinical-notes", "X-Data-Region": "eu-central"})
        self._decide(stub, "region mars-1: the solver rejects it before any index scan", {"X-Tenant": "shopwave"},
                     {"region": "mars-1"})
        self._decide(stub, "a malformed header", {"X-SLO-Latency": "fast", "X-Data-Region": "us-west"})
        self._decide(stub, "a misspelt header", {"X-Data-Regoin": "us-west"})
        self._decide(stub, "an unknown tenant", {"X-Tenant": "acme-bnak"})

    def _congestion(self, stub: pb_grpc.DecisionsStub, server: DecisionServer) -> None:
        self.head("5. congestion: an RDMA port climbs to 89 % watermark")
        headers = {"X-Tenant": "first-federal", "X-Model": "fraud-scorer", "X-Data-Region": "us-west"}
        before = self._decide(stub, "before", headers)
        if before is None or before.outcome != pb.ADMITTED or not before.placement.rdma_port:
            raise DemoError("the congestion scenario needs an admitted placement behind an RDMA port")
        port = before.placement.rdma_port
        assert server.cluster is not None
        server.cluster.watermark(port, 0.89)
        server.refresher.tick()
        self.say(f"\n  event: {port} watermark pinned at 89 % (collector tick {server.refresher.current().version})")
        after = self._decide(stub, "after", headers)
        if after is None or after.outcome != pb.ADMITTED:
            raise DemoError("no placement after the congestion event")
        was = f"{before.placement.host}/{before.placement.gpu} via {before.placement.rdma_port}"
        now = f"{after.placement.host}/{after.placement.gpu} via {after.placement.rdma_port}"
        if was == now:
            raise DemoError(f"the placement did not change after the congestion event ({now})")
        self.say(f"  placement changed: {was} → {now}")
        e = stub.Explain(pb.DecideRequest(headers=headers))
        old = f"{before.placement.host}/{before.placement.gpu}"
        shown = [x for x in e.decision.placement.rejected if x.gpu == old] or \
            [x for x in e.decision.placement.rejected if x.constraint == "port"][:1]
        for x in shown:
            self.say(f"  explain: not {x.gpu}: {x.constraint} ({x.detail})")
        server.cluster.clear(port)
        server.refresher.tick()

    def _budget_break(self, stub: pb_grpc.DecisionsStub, server: DecisionServer) -> None:
        self.head("6. a request runs far past its prediction: cancelled, retried on fraud-scorer-lite")
        g = server.guardian
        if g is None:
            raise DemoError("the guardian is off")
        headers = {"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"}
        d = self._decide(stub, "finance request to fraud-scorer (200 ms SLO)", headers)
        if d is None or d.outcome != pb.ADMITTED:
            raise DemoError("the fraud-scorer request was not admitted")
        call = _SimulatedCall()
        retried: list[RetryPlan] = []
        done = threading.Event()

        def on_redirect(plan: RetryPlan) -> None:
            retried.append(plan)
            done.set()

        gpu = f"{d.placement.host}/{d.placement.gpu}"
        predicted = d.placement.predicted.total_ms / 1e3
        deadline = g.begin(d.decision_id, "fraud-scorer", call, gpu_key=gpu, on_redirect=on_redirect, predicted=predicted)
        self.say(f"  model call running on {gpu} (predicted {predicted * 1e3:.1f} ms): network 12 + protocol 8 + runtime 140 "
                 f"+ hardware 25 ms … (break deadline in {(deadline - time.monotonic()) * 1e3 if deadline else float('nan'):.0f} ms)")
        done.wait(2.0)
        g.finish(d.decision_id)
        if not call.cancelled.is_set() or not retried:
            raise DemoError("the guardian did not break the over-budget call")
        self.say(f"  guardian: `{retried[0].rule}` cancelled the stream after {(time.monotonic() - call.started) * 1e3:.0f} ms; retry plan → "
                 f"`{retried[0].backup}` variant `{retried[0].variant}` headers {dict(retried[0].headers)}")
        retry_headers = {"X-Tenant": "acme-bank", "X-Model": retried[0].backup, **{k.title(): v for k, v in retried[0].headers}}
        r = self._decide(stub, "the retry", retry_headers)
        if r is None or r.outcome != pb.ADMITTED or r.retry_count != 1:
            raise DemoError("the retry on the backup was not admitted")
        g.begin(r.decision_id, retried[0].backup, _SimulatedCall(), retry_count=1)
        g.finish(r.decision_id)
        self._actions(server, ("cancel_stream", "redirect", "report_anomaly"), since=call.started, about=(d.decision_id, gpu))

    def _actions(self, server: DecisionServer, kinds: tuple[str, ...], since: float, about: tuple[str, ...]) -> None:
        assert server.actions is not None
        wall = time.time() - (time.monotonic() - since)
        for a in server.actions.memory.records:
            if a.kind.value in kinds and a.time >= wall - 0.01 and any(x in a.target for x in about):
                self.say(f"  action: {a.kind.value:<15} {a.target:<28} {a.outcome.value:<8} {a.detail}")

    def _self_heal(self, stub: pb_grpc.DecisionsStub, server: DecisionServer) -> None:
        self.head("7. SM utilisation collapses on one GPU: self-heal in dry run")
        assert server.cluster is not None
        headers = {"X-Tenant": "shopwave", "X-Model": "fraud-scorer-lite", "X-Data-Region": "us-east"}
        d = self._decide(stub, "a retail scoring request", headers)
        if d is None or d.outcome != pb.ADMITTED:
            raise DemoError("the scoring request was not admitted")
        gpu = f"{d.placement.host}/{d.placement.gpu}"
        started = time.monotonic()
        server.cluster.sm_collapse(gpu, 0.15)
        self.say(f"\n  event: {gpu} SM utilisation pinned at 15 % while work piles up")
        watch = server.gpu_watch
        for _ in range(12):
            server.refresher.tick()
            if any(k == gpu and "sm-collapse" in v.fired for k, v in watch.fired):
                break
        if not any(k == gpu and "sm-collapse" in v.fired for k, v in watch.fired):
            raise DemoError("sm-collapse did not fire after 10 consecutive anomalies")
        self._actions(server, ("self_heal_step", "report_anomaly"), since=started, about=(gpu,))
        after = self._decide(stub, "the same request after the heal", headers)
        if after is not None and after.outcome == pb.ADMITTED:
            self.say(f"  placement now {after.placement.host}/{after.placement.gpu} (the collapsed GPU is avoided)")
        server.cluster.clear(gpu)

    def _explain(self, stub: pb_grpc.DecisionsStub) -> None:
        self.head("8. Explain: why a healthcare request went where it went")
        e = stub.Explain(pb.DecideRequest(headers={"X-Tenant": "charite", "X-Data-Region": "eu-west"}))
        self.say(explanation_text(e))


def run_demo(out: TextIO, workdir: Path | None = None, *, on_error: Callable[[str], None] | None = None) -> int:
    """Run the demo in `workdir` (a fresh temporary directory when None); 0 on success."""
    if workdir is not None:
        return Demo(out, workdir).run()
    with tempfile.TemporaryDirectory(prefix="policyc-demo-") as tmp:
        return Demo(out, Path(tmp)).run()
