"""Changing the fleet or the bundle needs a credential by default, loopback included
(issue 36, "compliance bypass through registration"): a real `policyc serve` process makes
an operator token in a file only its user can read, refuses tokenless RegisterInstance,
DeregisterInstance and ReloadBundle, keeps decisions open, and the CLI on the same machine
picks the token up. `--open-fleet` opens it, loudly, on loopback only."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from policyc.compiler import bundle_io
from policyc.server.proto import pb, pb_grpc

POLICYC = [sys.executable, "-m", "policyc.cli.main"]
READY = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


class Served:
    """`policyc serve` in a subprocess; its stderr collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(POLICYC + ["serve", "--enforcer", "off", *argv], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(90):
            self.stop()
            raise AssertionError("no ready line: " + "".join(self.lines)[-2000:])
        m = next(READY.search(x) for x in self.lines if READY.search(x))
        self.port = int(m.group(1))
        self.address = f"127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "listening on" in line:
                self._ready.set()
        self._ready.set()

    @property
    def token_path(self) -> Path:
        m = next(re.search(r"operator token in (\S+)", x) for x in self.lines if "operator token in" in x)
        assert m is not None
        return Path(m.group(1))

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def bundle_path(bundle, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    p = tmp_path_factory.mktemp("fleet-access") / "bundle.json"
    bundle_io.write(bundle, p)
    return p


@pytest.fixture(scope="module")
def served(bundle_path: Path) -> Iterator[Served]:
    s = Served(["--bundle", str(bundle_path), "--port", "0", "--sim-hosts", "8"])
    yield s
    s.stop()


def _attacks(stub: pb_grpc.DecisionsStub, bundle_path: Path, metadata: tuple = ()) -> list[tuple[str, grpc.StatusCode, str]]:
    """The three calls the issue's attacker made, as a client without a token."""
    dep = pb.Deployment(host="host-0000", gpu="gpu0", gpu_model="A100-80G", region="us-west", tpm=True,
                        memory_encryption=True, hardware_firewall=True, endpoint="127.0.0.1:22")
    out = []
    for name, call, req in (
            ("RegisterInstance", stub.RegisterInstance, pb.RegisterInstanceRequest(id="evil", model="fraud-scorer", deployment=dep)),
            ("DeregisterInstance", stub.DeregisterInstance, pb.DeregisterInstanceRequest(instance_id="fraud-scorer@host-0000/gpu0")),
            ("ReloadBundle", stub.ReloadBundle, pb.ReloadBundleRequest(path=str(bundle_path)))):
        try:
            call(req, timeout=10, metadata=metadata)
            out.append((name, grpc.StatusCode.OK, ""))
        except grpc.RpcError as e:
            out.append((name, e.code(), e.details() or ""))
    return out


def test_tokenless_fleet_changes_are_refused_on_loopback(served: Served, bundle_path: Path) -> None:
    with grpc.insecure_channel(served.address) as ch:
        stub = pb_grpc.DecisionsStub(ch)
        for name, code, details in _attacks(stub, bundle_path):
            assert code is grpc.StatusCode.UNAUTHENTICATED and "needs a token" in details, (name, code, details)
        for name, code, details in _attacks(stub, bundle_path, (("authorization", "Bearer guessed-token-0000"),)):
            assert code is grpc.StatusCode.UNAUTHENTICATED and details == "unknown token", (name, code, details)
        # decisions stay open to clients without a token
        d = stub.Decide(pb.DecideRequest(headers={"X-SLO-Latency": "150ms"}), timeout=10)
        assert d.outcome in (pb.ADMITTED, pb.REJECTED)
        with pytest.raises(grpc.RpcError) as e:  # listing the fleet is not a client's
            stub.ListInstances(pb.ListInstancesRequest(), timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_the_token_file_is_private_and_works(served: Served, bundle_path: Path) -> None:
    path = served.token_path
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text().strip()
    with grpc.insecure_channel(served.address) as ch:
        stub = pb_grpc.DecisionsStub(ch)
        md = (("authorization", f"Bearer {token}"),)
        got = {name: code for name, code, _ in _attacks(stub, bundle_path, md)}
        # authorised: each call now reaches its own checks (the facts, the registry, the bundle)
        assert got["ReloadBundle"] is grpc.StatusCode.OK
        assert got["RegisterInstance"] is not grpc.StatusCode.UNAUTHENTICATED
        assert got["DeregisterInstance"] is grpc.StatusCode.NOT_FOUND  # authorised; the fleet is empty


def test_the_cli_on_this_machine_picks_the_token_up(served: Served, bundle_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from policyc.cli.main import main

    monkeypatch.delenv("POLICYC_TOKEN", raising=False)
    monkeypatch.delenv("POLICYC_TOKEN_FILE", raising=False)
    assert main(["instance", "list", "--server", served.address]) == 0
    assert main(["reload", str(bundle_path), "--server", served.address]) == 0
    capsys.readouterr()
    assert main(["instance", "deregister", "no-such", "--server", served.address, "--token", "wrong-token-0000"]) == 7
    assert "UNAUTHENTICATED: unknown token" in capsys.readouterr().err
    # --token-file and $POLICYC_TOKEN_FILE name it explicitly
    assert main(["instance", "list", "--server", served.address, "--token-file", str(served.token_path)]) == 0
    monkeypatch.setenv("POLICYC_TOKEN_FILE", str(served.token_path))
    assert main(["instance", "list", "--server", served.address]) == 0


def test_a_kept_token_survives_a_restart_and_a_readable_one_is_refused(bundle_path: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = tmp_path / "state"
    argv = ["--bundle", str(bundle_path), "--port", str(port), "--state-dir", str(state), "--sim-hosts", "4"]
    first = Served(argv)
    try:
        assert first.token_path == state / "operator-token"
        token = first.token_path.read_text().strip()
    finally:
        assert first.stop() == 0
    assert (state / "operator-token").exists()  # kept, not removed at stop
    again = Served(argv)
    try:
        assert again.token_path.read_text().strip() == token
    finally:
        again.stop()
    os.chmod(state / "operator-token", 0o644)
    r = subprocess.run(POLICYC + ["serve", "--enforcer", "off", *argv], capture_output=True, text=True, timeout=90)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "lets other users read the token" in r.stderr and "chmod 600" in r.stderr, r.stderr


def test_open_fleet_is_explicit_loud_and_loopback_only(bundle_path: Path) -> None:
    s = Served(["--bundle", str(bundle_path), "--port", "0", "--sim-hosts", "4", "--open-fleet"])
    try:
        text = "".join(s.lines)
        assert "--open-fleet: every caller" in text and "fleet OPEN to every caller" in text
        with grpc.insecure_channel(s.address) as ch:
            got = {n: c for n, c, _ in _attacks(pb_grpc.DecisionsStub(ch), bundle_path)}
        assert got["ReloadBundle"] is grpc.StatusCode.OK and got["DeregisterInstance"] is grpc.StatusCode.NOT_FOUND
    finally:
        s.stop()
    r = subprocess.run(POLICYC + ["serve", "--bundle", str(bundle_path), "--port", "0", "--host", "0.0.0.0",
                                  "--insecure-plaintext", "--open-fleet", "--enforcer", "off"],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 2 and "refusing --open-fleet on `0.0.0.0`" in r.stderr, r.stderr


def test_the_operators_networks_and_host_addresses_bound_endpoints(bundle) -> None:  # type: ignore[no-untyped-def]
    """`--endpoint-network` narrows where endpoints may be; `--host-address` tells the service
    an address of a host its topology source does not know."""
    from policyc.client import DecisionClient
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.config import ClusterSpec, ServeConfig
    from policyc.server.fleet import admissible_fleet

    cfg = ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=2, hosts_per_rack=4), start_refresher=False,
                      endpoint_networks=("10.40.0.0/16",), host_addresses=(("host-0001", "10.40.0.1"),))
    with ServerThread(DecisionServer(bundle, cfg)) as th:
        assert th.server.cluster is not None
        inst = next(i for i in admissible_fleet(bundle, th.server.cluster.gpu_slots()) if i.deployment.host == "host-0001")
        from policyc.server import convert

        def register(endpoint: str) -> str:
            msg = convert.register_request(inst.model_copy(update={"deployment": inst.deployment.model_copy(
                update={"endpoint": endpoint})}))
            with DecisionClient(f"127.0.0.1:{th.server.port}", token=th.server.operator_token) as c:
                try:
                    return c.register_message(msg).instance_id
                except Exception as e:  # noqa: BLE001 - ClientError: its message is what is checked
                    return str(e)

        assert register("10.40.0.1:8001") == inst.id
        assert "rule `outside-allowed-networks`: 127.0.0.1 is in none of 10.40.0.0/16" in register("127.0.0.1:8001")
        assert "rule `not-the-claimed-host`: 10.40.0.2 is not an address of host `host-0001`" in register("10.40.0.2:8001")


def test_where_each_kind_of_service_keeps_its_token(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The embedded default and a replica on a fixed port keep it in the state dir of the port
    (where the CLI looks); a throw-away service in its runtime entry only."""
    from types import SimpleNamespace

    from policyc.cluster.config import FleetConfig
    from policyc.cluster.serve_flags import default_state_dir, token_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    kept = FleetConfig(state_dir=tmp_path / "mine")
    assert token_dir(SimpleNamespace(state_dir=str(tmp_path / "mine")), kept, 0) == tmp_path / "mine"
    replica = SimpleNamespace(state_dir=None, etcd=["http://127.0.0.1:2379"])
    assert token_dir(replica, FleetConfig(etcd=("http://127.0.0.1:2379",)), 50061) == default_state_dir(50061)
    assert default_state_dir(50061) == tmp_path / "policyc" / "serve-50061"
    assert token_dir(SimpleNamespace(state_dir="none"), None, 50061) is None
    assert token_dir(SimpleNamespace(state_dir=None), None, 0) is None
