"""`policyc gateway` with real Envoy: the decision API takes no fleet change without the
operator token, and no endpoint at the gateway's own ports or at a metadata address
(issue 36: "compliance bypass through registration", "the gateway as a proxy to its own
admin API")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from policyc.compiler import bundle_io
from policyc.server import convert
from policyc.server.proto import pb, pb_grpc

from gateway_rig import PRIMARY, free_port

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


class RunningGateway:
    def __init__(self, bundle_path: Path, workdir: Path) -> None:
        self.api, self.listen, self.admin, self.picker = free_port(), free_port(), free_port(), free_port()
        env = {**os.environ, "XDG_STATE_HOME": str(workdir / "state")}  # its operator token goes there
        self.proc = subprocess.Popen(POLICYC + ["gateway", "--bundle", str(bundle_path), "--port", str(self.api),
                                                "--listen", f"127.0.0.1:{self.listen}", "--admin", f"127.0.0.1:{self.admin}",
                                                "--picker-port", str(self.picker), "--workdir", str(workdir / "gw")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                if "clients ->" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(90) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("the gateway did not start: " + "".join(self.lines)[-3000:])
        m = next(re.search(r"operator token in (\S+)", x) for x in self.lines if "operator token in" in x)
        assert m is not None
        self.token_path = Path(m.group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def gw(bundle, tmp_path_factory) -> Iterator[RunningGateway]:  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("gw-access")
    bundle_io.write(bundle, d / "bundle.json")
    g = RunningGateway(d / "bundle.json", d)
    yield g
    assert g.stop() == 0, "".join(g.lines)[-3000:]


def _finance_instance(endpoint: str) -> pb.RegisterInstanceRequest:
    """A registration with a hardened host's true facts (the attacker's claim) and `endpoint`."""
    from policyc.matcher.instance import Instance
    from policyc.placer import SimulatedCluster
    from policyc.server.config import ClusterSpec

    c = ClusterSpec()
    slot = next(s for s in SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()
                if s.host == "host-0002" and s.gpu == "gpu0")
    inst = Instance(id="evil@host-0002/gpu0", model=PRIMARY, deployment=slot.to_deployment().model_copy(update={"endpoint": endpoint}))
    return convert.register_request(inst)


def test_a_client_without_the_token_cannot_change_the_gateways_fleet(gw: RunningGateway) -> None:
    # the token is kept in the state dir of the API's port (mode 0600), where the CLI looks
    assert gw.token_path.parts[-3:] == ("policyc", f"serve-{gw.api}", "operator-token")
    assert gw.token_path.stat().st_mode & 0o777 == 0o600
    with grpc.insecure_channel(f"127.0.0.1:{gw.api}") as ch:
        stub = pb_grpc.DecisionsStub(ch)
        for call, req in ((stub.RegisterInstance, _finance_instance(f"127.0.0.1:{gw.admin}")),
                          (stub.DeregisterInstance, pb.DeregisterInstanceRequest(instance_id="fraud-scorer@host-0002/gpu0")),
                          (stub.ReloadBundle, pb.ReloadBundleRequest(path="/etc/passwd"))):
            with pytest.raises(grpc.RpcError) as e:
                call(req, timeout=10)
            assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED and "needs a token" in (e.value.details() or "")


@pytest.mark.parametrize("where, rule, words", [
    ("admin", "gateway-own-port", "Envoy's admin interface"),
    ("listen", "gateway-own-port", "Envoy's listener"),
    ("picker", "gateway-own-port", "endpoint picker"),
    ("api", "gateway-own-port", "the decision API"),
    ("169.254.169.254:80", "cloud-metadata-address", "metadata"),
    ("[fe80::1]:8001", "link-local-address", "link-local"),
    ("0.0.0.0:8001", "unspecified-address", "unspecified"),
    ("239.1.1.1:8001", "multicast-address", "multicast"),
    ("198.18.0.9:8001", "not-the-claimed-host", "host `host-0009`'s, not `host-0002`'s"),
    ("10.20.30.40:8001", "outside-allowed-networks", "no address of the topology's"),
])
def test_the_operator_cannot_point_an_instance_at_the_gateway_itself(gw: RunningGateway, where: str, rule: str,
                                                                     words: str) -> None:
    endpoint = where if ":" in where else f"127.0.0.1:{getattr(gw, where)}"
    token = gw.token_path.read_text().strip()
    with grpc.insecure_channel(f"127.0.0.1:{gw.api}") as ch:
        stub = pb_grpc.DecisionsStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.RegisterInstance(_finance_instance(endpoint), timeout=10, metadata=(("authorization", f"Bearer {token}"),))
    details = e.value.details() or ""
    assert f"rule `{rule}`" in details and words in details, details
    from grpc_status import rpc_status

    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo()
    status = rpc_status.from_call(e.value)  # type: ignore[arg-type]
    assert status is not None and any(d.Unpack(info) for d in status.details if d.Is(info.DESCRIPTOR))
    assert info.reason == "E725" and info.metadata["rule"] == rule
    # Envoy still runs, its admin API unreached through the gateway
    with urllib.request.urlopen(f"http://127.0.0.1:{gw.admin}/ready", timeout=5) as r:  # noqa: S310 - loopback
        assert r.status == 200
    assert gw.proc.poll() is None


def test_the_operator_registers_a_real_endpoint(gw: RunningGateway) -> None:
    """The control: the same claim with an endpoint on the claimed host (loopback, where the
    simulated cluster's model servers run) and a port of no gateway part is accepted."""
    token = gw.token_path.read_text().strip()
    with grpc.insecure_channel(f"127.0.0.1:{gw.api}") as ch:
        stub = pb_grpc.DecisionsStub(ch)
        md = (("authorization", f"Bearer {token}"),)
        reply = stub.RegisterInstance(_finance_instance(f"127.0.0.1:{free_port()}"), timeout=10, metadata=md)
        assert reply.instance_id == "evil@host-0002/gpu0"
        stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=reply.instance_id), timeout=10, metadata=md)
