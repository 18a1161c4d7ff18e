"""`policyc gateway`: one command gives a working gateway that follows registrations, and
`--print-bootstrap` gives a bootstrap Envoy accepts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from policyc.client import operator_channel
from policyc.compiler import bundle_io
from policyc.gateway.bootstrap import PICKER_CLUSTER
from policyc.gateway.envoy_process import envoy_binary
from policyc.matcher.instance import Instance
from policyc.modelserver.client import OipClient, token_ids
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import write_model_files
from policyc.server import convert
from policyc.server.proto import pb_grpc

from gateway_rig import PRIMARY, free_port

POLICYC = [sys.executable, "-m", "policyc.cli.main"]


def test_print_bootstrap_is_a_config_envoy_accepts(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)
    out = subprocess.run(POLICYC + ["gateway", "--print-bootstrap", "--bundle", str(path), "--picker", "127.0.0.1:9002",
                                    "--endpoint", "127.0.0.1:8001", "--endpoint", "127.0.0.1:8002"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    boot = json.loads(out.stdout)
    pool = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "policyc_pool")
    assert pool["circuit_breakers"]["thresholds"][0]["retry_budget"]  # the breakers' retry budget
    (tmp_path / "envoy.json").write_text(out.stdout)
    check = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(tmp_path / "envoy.json")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "OK" in check.stdout + check.stderr, check.stdout[-2000:] + check.stderr[-2000:]


@pytest.mark.parametrize("argv, words", [
    (["--print-bootstrap", "--endpoint", "localhost:8001"], ["`localhost`", "not an IP address"]),
    (["--print-bootstrap", "--endpoint", "127.0.0.1:99999"], ["port `99999`"]),
    (["--print-bootstrap"], ["needs the pool"]),
    (["--listen", "127.0.0.1"], ["give --bundle"]),
])
def test_bad_gateway_arguments_are_one_line_errors(argv: list[str], words: list[str]) -> None:
    out = subprocess.run(POLICYC + ["gateway", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    for w in words:
        assert w in out.stderr, out.stderr


def test_one_command_gives_a_gateway_that_follows_registrations(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)
    api, listen, admin, picker = free_port(), free_port(), free_port(), free_port()
    proc = subprocess.Popen(POLICYC + ["gateway", "--bundle", str(path), "--port", str(api), "--listen", f"127.0.0.1:{listen}",
                                       "--admin", f"127.0.0.1:{admin}", "--picker-port", str(picker),
                                       "--workdir", str(tmp_path / "gw"), "--state-dir", str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    files = write_model_files(bundle.contract(PRIMARY), tmp_path / "models")
    models = ModelPool([ServerSpec((InstanceSpec("fraud-scorer@host-0002/gpu0", files.full),))],
                       workdir=tmp_path / "servers").start(timeout=60)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{api}") as probe:  # up: its operator token is in its state dir
            grpc.channel_ready_future(probe).result(timeout=30)
        with operator_channel(f"127.0.0.1:{api}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            d = next(s.to_deployment() for s in _slots() if s.host == "host-0002" and s.gpu == "gpu0")
            inst = Instance(id="fraud-scorer@host-0002/gpu0", model=PRIMARY,
                            deployment=d.model_copy(update={"endpoint": models.endpoint("fraud-scorer@host-0002/gpu0")}))
            stub.RegisterInstance(convert.register_request(inst, onnx_model=files.full.read_bytes()), timeout=10)
        with OipClient(f"127.0.0.1:{listen}") as c:
            deadline, answer, last = time.monotonic() + 10, None, ""
            while answer is None and time.monotonic() < deadline:
                try:  # the pool file is rewritten and Envoy loads it within a few hundred ms
                    answer = c.infer(PRIMARY, token_ids(16), timeout=5,
                                     metadata=(("x-model", PRIMARY), ("x-tenant", "acme-bank")))
                except grpc.RpcError as e:
                    last = f"{e.code()}: {e.details()}"
                    time.sleep(0.1)
            assert answer is not None, last
            assert answer.instance == "fraud-scorer@host-0002/gpu0" and answer.decision_id
            # Envoy reached the picker on its Unix socket in the workdir (cheaper than TCP loopback)
            boot = json.loads((tmp_path / "gw" / "envoy.json").read_text())
            picker_cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == PICKER_CLUSTER)
            assert picker_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == \
                {"pipe": {"path": str(tmp_path / "gw" / "picker.sock")}}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        models.stop()
    assert proc.returncode == 0, err[-3000:]
    assert "clients ->" in err


def test_a_gateway_refuses_an_admin_address_off_loopback(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Envoy's admin can stop it and read its configuration: loopback only, said before anything starts."""
    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)
    out = subprocess.run(POLICYC + ["gateway", "--bundle", str(path), "--port", "0", "--admin", "10.1.2.3:9901"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--admin 10.1.2.3:9901" in out.stderr and "loopback" in out.stderr, out.stderr


def _slots():  # type: ignore[no-untyped-def]
    from policyc.placer import SimulatedCluster
    from policyc.server.config import ClusterSpec

    c = ClusterSpec()
    return SimulatedCluster(c.seed, c.hosts, c.gpus_per_host, hosts_per_rack=c.hosts_per_rack).gpu_slots()


def test_a_gateway_with_a_public_key_refuses_an_unsigned_bundle(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from policyc.cli.keys import generate

    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)  # unsigned
    generate(str(tmp_path / "op.key"), str(tmp_path / "op.pub"))
    out = subprocess.run(POLICYC + ["gateway", "--bundle", str(path), "--public-key", str(tmp_path / "op.pub"),
                                    "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "sign" in out.stderr, out.stderr
