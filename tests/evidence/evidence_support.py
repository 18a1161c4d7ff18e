"""A real gateway as `policyc gateway` runs it (`gateway/runner.py`: the picker, the EDS file,
Envoy, policyc's access-log receiver) next to a decision service with an audit log, in
front of real KServe model servers registered over `RegisterInstance`."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
import ipaddress
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gateway"))
from gateway_rig import BACKUP, PRIMARY, SMALL, free_port, pool_layout  # noqa: E402

from policyc.client import operator_channel  # noqa: E402
from policyc.compiler.bundle import Bundle  # noqa: E402
from policyc.enforcer.signal_windows import SignalWindows  # noqa: E402
from policyc.compiler.pipeline import compile_paths  # noqa: E402
from policyc.gateway.runner import Gateway, GatewayOptions  # noqa: E402
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec  # noqa: E402
from policyc.modelserver.model_files import write_model_files  # noqa: E402
from policyc.server import convert  # noqa: E402
from policyc.server.app import DecisionServer, ServerThread  # noqa: E402
from policyc.server.config import EnforcerMode, ServeConfig  # noqa: E402
from policyc.server.proto import pb_grpc  # noqa: E402


class EvidenceRig:
    def __init__(self, bundle: Bundle, workdir: Path, accounting: bool = True,
                 enforcer: EnforcerMode = EnforcerMode.USERSPACE, listen_host: str = "127.0.0.1",
                 tls: tuple[Path, Path] | None = None, audit: bool = True, primaries: int = 1,
                 place: Callable[[str, ServerSpec], ServerSpec] | None = None, backups: int = 1) -> None:
        """`place(model, spec)`: the spec a slot's model server runs with (e.g. in a network
        namespace); given, every server is its own process (no zygote: a fork keeps its parent's namespace).
        `backups`: model servers of the backup model, each on a GPU of its own (the benchmark's
        callers of the backup model need the GPU share of several)."""
        self.workdir = workdir
        cfg = ServeConfig(cluster=SMALL, enforcer=enforcer, audit_log=workdir / "audit.db" if audit else None)
        self.thread = ServerThread(DecisionServer(bundle, cfg))
        self.thread.start()
        server = self.thread.server
        self.slots = pool_layout(bundle, server, primaries, backups)
        files = workdir / "models"
        full = write_model_files(bundle.contract(PRIMARY), files)  # type: ignore[arg-type]
        lite = write_model_files(bundle.contract(BACKUP), files, simplified=True)  # type: ignore[arg-type]
        specs = [ServerSpec((InstanceSpec(s.instance_id, full.full),), stall_control=True) if s.model == PRIMARY else
                 ServerSpec((InstanceSpec(s.instance_id, lite.full, lite.simplified, name=BACKUP, aliases=(PRIMARY,)),))
                 for s in self.slots]
        if place is not None:
            specs = [place(s.model, spec) for s, spec in zip(self.slots, specs)]
        self.models = ModelPool(specs, workdir=workdir / "servers", fork=place is None).start(timeout=60)
        for s in self.slots:  # a server placed off loopback (a namespace): its address declared as its host's
            ip = self.models.endpoint(s.instance_id).rpartition(":")[0].strip("[]")
            if not ipaddress.ip_address(ip).is_loopback:
                server.service.endpoints.declare(s.instance.deployment.host, ip)  # as `--host-address HOST=IP`
        with operator_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for s in self.slots:
                inst = s.instance.model_copy(update={"deployment": s.instance.deployment.model_copy(
                    update={"endpoint": self.models.endpoint(s.instance_id)})})
                f = full.full if s.model == PRIMARY else lite.full
                stub.RegisterInstance(convert.register_request(inst, onnx_model=f.read_bytes()), timeout=10)
        self.listen = f"{listen_host}:{free_port()}"
        self.gateway = Gateway(self.thread, GatewayOptions(listen=self.listen, admin=f"127.0.0.1:{free_port()}",
                                                           workdir=workdir / "gateway", accounting=accounting,
                                                           tls_cert=tls[0] if tls else None,
                                                           tls_key=tls[1] if tls else None)).start()

    def stop(self) -> None:
        if getattr(self, "_stopped", False):
            return
        self._stopped = True
        for step in (self.gateway.stop, self.thread.stop, self.models.stop):
            try:
                step()
            except Exception:  # noqa: BLE001 - stop everything that was started
                pass


@contextmanager
def signal_events(windows: SignalWindows) -> Iterator[list[tuple[str, str, float]]]:
    """Every (key, signal, value) the product feeds `windows` while inside, passed on as fed."""
    seen: list[tuple[str, str, float]] = []
    real_event = windows.event

    def spy(key: str, signal: str, value: float, t: float) -> None:
        seen.append((key, signal, value))
        real_event(key, signal, value, t)

    windows.event = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        windows.event = real_event  # type: ignore[method-assign]

@pytest.fixture(scope="session")
def bundle() -> Bundle:
    """The example policies, `slow-placement` at 2000 % of the predicted time (tests/rig_policies.py says why)."""
    from rig_policies import rig_policies

    r = compile_paths([str(rig_policies())], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


@pytest.fixture(scope="module")
def rig(bundle: Bundle) -> Iterator[EvidenceRig]:
    r = EvidenceRig(bundle, Path(tempfile.mkdtemp(prefix="policyc-evidence-")))
    yield r
    r.stop()
