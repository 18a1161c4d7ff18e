"""A real gateway on loopback for the tests and the benchmark: real KServe model servers
(the model-server helper's launcher), the decision service with its picker, real Envoy.

`pool_layout(bundle, cluster)` chooses simulated GPU slots the contracts admit for the
primaries and the backup; `Gateway.start(...)` registers each model server as an instance
with its endpoint over the real `RegisterInstance` RPC (the ONNX model carries its
contract) and starts Envoy on the bootstrap `policyc gateway` writes: its access log goes
to policyc's receiver, from which the picker learns breaks (`access_log=False`: an Envoy
without it, the picker learning them in the response phase).
"""

from __future__ import annotations

import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.gateway.access_log import AccessLogReceiver, AccessLogServer
from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.gateway.picker import PickerConfig
from policyc.gateway.server import PickerServer
from policyc.matcher.instance import Instance
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import write_model_files
from policyc.server import convert
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet, instance_id
from policyc.server.proto import pb_grpc

SMALL = ClusterSpec(seed=1, hosts=32, gpus_per_host=4, hosts_per_rack=4)
PRIMARY, BACKUP = "fraud-scorer", "fraud-scorer-lite"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Slot:
    instance_id: str
    model: str
    instance: Instance  # deployment facts, endpoint still empty


def pool_layout(bundle: Bundle, server: DecisionServer, primaries: int = 2, backups: int = 1) -> list[Slot]:
    """`primaries` instances of the primary model and `backups` of the backup, each on its own GPU."""
    assert server.cluster is not None
    fleet = admissible_fleet(bundle, server.cluster.gpu_slots(), models=[PRIMARY, BACKUP])
    out: list[Slot] = []
    used: set[tuple[str, str]] = set()
    for model, n in ((PRIMARY, primaries), (BACKUP, backups)):
        for inst in fleet:
            gpu = (inst.deployment.host, inst.deployment.gpu)
            if inst.model == model and gpu not in used and len([s for s in out if s.model == model]) < n:
                used.add(gpu)
                iid = instance_id(model, *gpu) + "#gw"
                out.append(Slot(iid, model, inst.model_copy(update={"id": iid})))
    assert len(out) == primaries + backups, "the simulated cluster has too few admissible GPUs"
    return out


@dataclass
class Gateway:
    bundle: Bundle
    workdir: Path
    failure_mode_allow: bool = False
    fleet: bool = True  # the simulated fleet without endpoints too (placement at scale)
    primaries: int = 2
    audit: bool = True
    max_in_flight: int = 512
    access_log: bool = True  # the picker follows Envoy's access log (as `policyc gateway` runs it)
    thread: ServerThread = field(init=False)
    picker: PickerServer = field(init=False)
    models: ModelPool = field(init=False)
    envoy: EnvoyProcess = field(init=False)
    slots: list[Slot] = field(init=False)
    listen: str = field(init=False)
    als: AccessLogServer | None = field(init=False, default=None)

    def start(self) -> "Gateway":
        cfg = ServeConfig(cluster=SMALL, enforcer=EnforcerMode.USERSPACE,
                          audit_log=self.workdir / "audit.db" if self.audit else None)
        server = DecisionServer(self.bundle, cfg)
        self.thread = ServerThread(server)
        self.thread.start()
        if self.fleet:
            assert server.cluster is not None
            server.engine.register_many(admissible_fleet(self.bundle, server.cluster.gpu_slots()))
        self.slots = pool_layout(self.bundle, server, self.primaries)
        files = self.workdir / "models"
        full = write_model_files(self.bundle.contract(PRIMARY), files)  # type: ignore[arg-type]
        lite = write_model_files(self.bundle.contract(BACKUP), files, simplified=True)  # type: ignore[arg-type]
        specs = []
        for s in self.slots:
            if s.model == PRIMARY:
                specs.append(ServerSpec((InstanceSpec(s.instance_id, full.full),), stall_control=True))
            else:
                specs.append(ServerSpec((InstanceSpec(s.instance_id, lite.full, lite.simplified, name=BACKUP,
                                                      aliases=(PRIMARY,)),)))
        self.models = ModelPool(specs, workdir=self.workdir / "servers").start(timeout=60)
        with operator_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for s in self.slots:
                inst = s.instance.model_copy(update={"deployment": s.instance.deployment.model_copy(
                    update={"endpoint": self.models.endpoint(s.instance_id)})})
                model_file = full.full if s.model == PRIMARY else lite.full
                stub.RegisterInstance(convert.register_request(inst, onnx_model=model_file.read_bytes()), timeout=10)
        self.picker = PickerServer(server, PickerConfig(max_in_flight=self.max_in_flight))
        picker_port = self.thread.call(self.picker.start())
        als = None
        if self.access_log:
            self.als = AccessLogServer(AccessLogReceiver(None, every_attempt=False))  # what the picker needs alone
            als = self.thread.call(self.als.start())
            self.picker.picker.follow_access_log(self.als.receiver)
        self.listen = f"127.0.0.1:{free_port()}"
        spec = GatewaySpec(picker=f"127.0.0.1:{picker_port}", listen=self.listen, admin=f"127.0.0.1:{free_port()}",
                           endpoints=tuple(i.endpoint for i in self.models.instances),
                           failure_mode_allow=self.failure_mode_allow, access_log_cluster=als,
                           breaks_from_access_log=als is not None, log_every_call=als is None)
        self.envoy = EnvoyProcess(build_bootstrap(spec), self.workdir / "envoy").start()
        return self

    @property
    def server(self) -> DecisionServer:
        return self.thread.server

    def endpoint_of(self, instance_id: str) -> str:
        return self.models.endpoint(instance_id)

    def stop(self) -> None:
        als = self.als
        for step in (self.envoy.stop, lambda: als is not None and self.thread.call(als.stop()),
                     lambda: self.thread.call(self.picker.stop()), self.thread.stop, self.models.stop):
            try:
                step()
            except Exception:  # noqa: BLE001 - stop everything that was started, whatever failed first
                pass


def start_gateway(bundle: Bundle, **kw: object) -> Gateway:
    workdir = Path(tempfile.mkdtemp(prefix="policyc-gw-"))
    return Gateway(bundle, workdir, **kw).start()  # type: ignore[arg-type]
