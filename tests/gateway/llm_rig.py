"""A real gateway for LLM traffic on loopback: the decision service compiled from
`policies` and `policies/llm`, its picker reading LLM bodies (the model's tokenizer), real
Envoy with the LLM routes, and OpenAI-compatible HTTP/1.1 model servers registered over the
real `RegisterInstance` RPC with `endpoint_protocol: http1`.

The model servers are what the caller gives (`endpoints`: vLLM's, from tests/llm), or the
fake OpenAI server processes this rig starts (`fake_openai.py`), two of `tiny-llm` and one
of `tiny-llm-lite`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.gateway.access_log import AccessLogReceiver, AccessLogServer
from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.gateway.llm_pick import LlmPicks
from policyc.gateway.llm_routes import HTTP1, PROTOCOL_LABEL, LlmRoutes
from policyc.gateway.llm_stream import StreamSupervisor, SupervisorServer
from policyc.gateway.picker import PickerConfig
from policyc.gateway.server import PickerServer
from policyc.gateway.tokens import Tokenizers
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet, instance_id
from policyc.server.proto import pb_grpc

from gateway_rig import SMALL, free_port

REPO = Path(__file__).resolve().parents[2]
LLM, LITE = "tiny-llm", "tiny-llm-lite"


def llm_bundle(paths: tuple[Path, ...] = (REPO / "policies" / "llm",)) -> Bundle:
    """`policies` (the request mappings, tenants, rules) with the LLM contracts in `paths`."""
    r = compile_paths([str(REPO / "policies"), *map(str, paths)], analyse=False)
    assert r.ok and r.bundle is not None, [d.message for d in r.diagnostics]
    return r.bundle


@dataclass
class FakeServer:
    instance_id: str
    model: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_fake(instance: str, models: list[str], stalls: bool = False) -> FakeServer:
    port = free_port()
    p = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fake_openai.py")), str(port), instance,
                          *(["--stalls"] if stalls else []), *models],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == b"ready", f"fake OpenAI server {instance} did not start: {line!r}"
    return FakeServer(instance, models[0], port, p)


@dataclass
class LlmGateway:
    workdir: Path
    tokenizer: Path | None = None  # the models' tokenizer.json (None: the declared estimate)
    served: list[tuple[str, str]] = field(default_factory=list)  # (model, endpoint) of servers started elsewhere
    max_body_bytes: int = 4 << 20
    body_timeout_ms: int = 10_000
    contracts: tuple[Path, ...] = (REPO / "policies" / "llm",)  # compiled with `policies`
    contexts: dict[str, int] = field(default_factory=dict)  # a model's context, where its contract has none
    model_dir: Path | None = None  # registered as the instances' `model_dir` label (the picker finds the tokenizer there)
    bundle: Bundle = field(init=False)
    thread: ServerThread = field(init=False)
    picker: PickerServer = field(init=False)
    envoy: EnvoyProcess = field(init=False)
    als: AccessLogServer = field(init=False)
    fakes: list[FakeServer] = field(init=False, default_factory=list)
    instances: dict[str, str] = field(init=False, default_factory=dict)  # endpoint -> instance id
    listen: str = field(init=False)
    picks: LlmPicks = field(init=False)
    supervisor: StreamSupervisor = field(init=False)
    supervisor_server: SupervisorServer = field(init=False)

    def start(self) -> "LlmGateway":
        self.bundle = llm_bundle(self.contracts)
        server = DecisionServer(self.bundle, ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE,
                                                         audit_log=self.workdir / "audit.db"))
        self.thread = ServerThread(server)
        self.thread.start()
        assert server.cluster is not None
        served = self.served or [(LLM, ""), (LLM, ""), (LITE, "")]
        fleet = admissible_fleet(self.bundle, server.cluster.gpu_slots(), models=sorted({m for m, _ in served}))
        used: set[tuple[str, str]] = set()
        with operator_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for i, (model, endpoint) in enumerate(served):
                inst = next(x for x in fleet if x.model == model and (x.deployment.host, x.deployment.gpu) not in used)
                used.add((inst.deployment.host, inst.deployment.gpu))
                iid = instance_id(model, inst.deployment.host, inst.deployment.gpu) + f"#llm{i}"
                if not endpoint:
                    fake = start_fake(iid, [model], stalls=model == LLM)  # the backup never stalls
                    self.fakes.append(fake)
                    endpoint = fake.endpoint
                self.instances[endpoint] = iid
                labels = {PROTOCOL_LABEL: HTTP1, **({"model_dir": str(self.model_dir)} if self.model_dir else {})}
                inst = inst.model_copy(update={"id": iid, "labels": labels,
                                               "deployment": inst.deployment.model_copy(update={"endpoint": endpoint})})
                stub.RegisterInstance(convert.register_request(inst), timeout=10)
        self.picker = PickerServer(server, PickerConfig())
        picker_port = self.thread.call(self.picker.start())
        tokenizers = Tokenizers()
        if self.tokenizer is not None:
            for m in sorted({m for m, _ in served}):
                tokenizers.register(m, self.tokenizer)
        self.picks = LlmPicks(tokenizers, dict(self.contexts), max_body_bytes=self.max_body_bytes)
        self.picker.picker.enable_llm(self.picks)
        recent = self.picker.picker.recent
        self.supervisor = StreamSupervisor(self.picks, lambda: server.engine.state.bundle, self.picker.acts.log,
                                           self.picker.acts.anomalies,
                                           lambda did: recent[did].gpu_key if did in recent else None,
                                           lambda did: recent[did].retry_headers if did in recent else (),
                                           self._gpu_model_of, self.picker.picker.end_in_flight,
                                           self.picker.picker.first_token)
        self.supervisor_server = SupervisorServer(self.supervisor)
        supervisor_port = self.thread.call(self.supervisor_server.start())
        self.als = AccessLogServer(AccessLogReceiver(None, every_attempt=False))
        als = self.thread.call(self.als.start())
        self.picker.picker.follow_access_log(self.als.receiver)
        self.listen = f"127.0.0.1:{free_port()}"
        spec = GatewaySpec(picker=f"127.0.0.1:{picker_port}", listen=self.listen, admin=f"127.0.0.1:{free_port()}",
                           endpoints=tuple(self.instances), access_log_cluster=als, breaks_from_access_log=True,
                           log_every_call=False,
                           llm=LlmRoutes(max_body_bytes=self.max_body_bytes, body_timeout_ms=self.body_timeout_ms,
                                         supervisor=f"127.0.0.1:{supervisor_port}"))
        self.envoy = EnvoyProcess(build_bootstrap(spec), self.workdir / "envoy").start()
        return self

    def _gpu_model_of(self, decision_id: str) -> str | None:
        pick = self.picker.picker.recent.get(decision_id)
        if pick is None:
            return None
        try:
            return self.server.engine.state.registry.get(pick.instance_id).deployment.gpu_model
        except Exception:  # noqa: BLE001 - deregistered since
            return None

    @property
    def server(self) -> DecisionServer:
        return self.thread.server

    def stop(self) -> None:
        for step in (lambda: self.envoy.stop(), lambda: self.thread.call(self.als.stop()),
                     lambda: self.thread.call(self.supervisor_server.stop()),
                     lambda: self.thread.call(self.picker.stop()), lambda: self.thread.stop()):
            try:
                step()
            except Exception:  # noqa: BLE001 - stop everything that was started, whatever failed first
                pass
        for f in self.fakes:
            f.process.terminate()
            try:
                f.process.wait(5)
            except subprocess.TimeoutExpired:
                f.process.kill()


def start_llm_gateway(**kw: object) -> LlmGateway:
    workdir = Path(tempfile.mkdtemp(prefix="policyc-llm-gw-"))
    os.makedirs(workdir, exist_ok=True)
    gw = LlmGateway(workdir, **kw)  # type: ignore[arg-type]
    try:
        return gw.start()
    except BaseException:  # a start that fails half-way stops what it started (the model servers above all)
        gw.stop()
        raise
