"""`RegisterInstances` against a real `policyc serve` (a subprocess, its operator token read
from its state dir as the CLI reads it): each item checked as RegisterInstance checks it, a
refused item named in its own result without stopping the others, the admitted ones
registered in one batch and served; operator-only."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from policyc.cli.exit_codes import Exit
from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.matcher import Deployment, Instance, admission_problems
from policyc.server.proto import pb, pb_grpc

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "policyc.cli.main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(d: Path, bundle: Bundle) -> tuple[subprocess.Popen[bytes], str]:
    """`policyc serve` on `d/state`, answering (its operator token made)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLICYC_")}
    from policyc.compiler import bundle_io
    (d / "bundle.json").write_text(bundle_io.dumps(bundle))
    port = _free_port()
    log = open(d / "serve.log", "a")
    proc = subprocess.Popen([*CLI, "serve", "--bundle", str(d / "bundle.json"), "--port", str(port),
                             "--state-dir", str(d / "state")], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    log.close()
    server = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("serve did not answer: " + (d / "serve.log").read_text())
        if (d / "state" / "operator-token").exists():
            try:
                with operator_channel(server) as ch:
                    pb_grpc.DecisionsStub(ch).ListHosts(pb.ListHostsRequest(), timeout=5)
                return proc, server
            except grpc.RpcError:
                pass
        time.sleep(0.3)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Bundle, Path]]:
    d = tmp_path_factory.mktemp("serve")
    r = compile_paths([str(ROOT / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    proc, server = _serve(d, r.bundle)
    try:
        yield server, r.bundle, d
    finally:
        _stop(proc)


def _slots(stub: pb_grpc.DecisionsStub, bundle: Bundle, tpm: bool | None = None) -> list[tuple[str, Deployment]]:
    """(model, deployment) pairs the topology's facts and the bundle admit."""
    out = []
    for h in stub.ListHosts(pb.ListHostsRequest(), timeout=10).hosts:
        if tpm is not None and h.tpm != tpm:
            continue
        for g in h.gpus:
            d = Deployment(host=h.host, gpu=g.gpu, gpu_model=g.gpu_model, region=h.region, numa_node=g.numa_node,
                           tpm=h.tpm, memory_encryption=h.memory_encryption, hardware_firewall=h.hardware_firewall,
                           tee=h.tee, session_state=g.session_state or "remote", cuda=h.cuda or "12.4")
            for c in bundle.contracts:
                if not admission_problems(Instance(id="probe", model=c.name, deployment=d), bundle):
                    out.append((c.name, d))
    return out


def _item(iid: str, model: str, d: Deployment, **extra: object) -> pb.RegisterInstanceRequest:
    return pb.RegisterInstanceRequest(id=iid, model=model, deployment=pb.Deployment(**d.model_dump()), **extra)


def _listed(stub: pb_grpc.DecisionsStub) -> set[str]:
    return {i.id for i in stub.ListInstances(pb.ListInstancesRequest(), timeout=30).instances}


def test_each_item_is_checked_and_a_refused_one_does_not_stop_the_others(served) -> None:  # type: ignore[no-untyped-def]
    server, bundle, _ = served
    with operator_channel(server) as ch:
        stub = pb_grpc.DecisionsStub(ch)
        slots = _slots(stub, bundle)
        (m0, d0), (m1, d1) = slots[0], slots[1]
        tpm = next(((m, d) for m, d in slots if d.tpm), None)
        plain = next(((m, d) for m, d in slots if not d.tpm), None)
        other_region = next(r for r in ("us-west", "us-east", "eu-west", "eu-central") if r != d0.region)
        items = [
            _item("batch-ok-0", m0, d0, score=0.75),
            _item("batch-unknown-model", "no-such-contract", d0),
            _item("batch-metadata", m0, d0.model_copy(update={"endpoint": "169.254.169.254:80"})),
            _item("batch-ok-1", m1, d1),
            pb.RegisterInstanceRequest(id="batch-no-host", model=m0, deployment=pb.Deployment(gpu="gpu0", gpu_model="H100",
                                                                                             region="us-west")),
            _item("batch-ok-0", m1, d1),  # the same id twice in one call
            _item("batch-false-region", m0, d0.model_copy(update={"region": other_region})),
            _item("batch-bad-score", m0, d0, score=1.5),
        ]
        names = ["batch-ok-0", "batch-ok-1"]
        for n, pair in enumerate(p for p in (tpm, plain) if p is not None):
            items.append(_item(f"batch-flag-{n}", *pair))
            names.append(f"batch-flag-{n}")
        got = stub.RegisterInstances(pb.RegisterInstancesRequest(instances=items), timeout=60)
        res = list(got.results)
        assert [r.instance_id for r in res] == [i.id for i in items]
        by = {(r.instance_id, n): r for n, r in enumerate(res)}
        assert {r.instance_id for r in res if r.registered} == set(names) and got.registered == len(names)
        assert by[("batch-ok-0", 0)].registered and not by[("batch-ok-0", 5)].registered
        dup = by[("batch-ok-0", 5)]
        assert (dup.status, dup.field) == ("ALREADY_EXISTS", "id") and "batch-ok-0" in dup.message
        unknown = by[("batch-unknown-model", 1)]
        assert (unknown.status, unknown.field) == ("NOT_FOUND", "model") and "no-such-contract" in unknown.message
        meta = by[("batch-metadata", 2)]
        assert meta.field == "deployment.endpoint" and meta.status and not meta.registered
        assert "cloud-metadata-address" in meta.message and "batch-metadata" in meta.message
        host = by[("batch-no-host", 4)]
        assert (host.status, host.field) == ("INVALID_ARGUMENT", "deployment.host")
        region = by[("batch-false-region", 6)]
        assert not region.registered and region.status == "FAILED_PRECONDITION" and "region" in region.message
        score = by[("batch-bad-score", 7)]
        assert (score.status, score.field) == ("INVALID_ARGUMENT", "score")
        listed = _listed(stub)
        assert set(names) <= listed and not {"batch-unknown-model", "batch-metadata", "batch-no-host"} & listed
        assert got.registry_size == len(listed)
        # a refusal in the batch reads as RegisterInstance's refusal of the same item
        with pytest.raises(grpc.RpcError) as one:
            stub.RegisterInstance(items[1], timeout=30)
        assert one.value.code() is grpc.StatusCode.NOT_FOUND and unknown.message in one.value.details()
        # registered in the batch means matched as any registered instance is
        every = stub.MatchAll(pb.MatchAllRequest(request=pb.DecideRequest(headers={"X-Model": m0})), timeout=30)
        assert "batch-ok-0" in every.instance_ids


def test_register_instances_is_operator_only(served) -> None:  # type: ignore[no-untyped-def]
    server, bundle, _ = served
    with grpc.insecure_channel(server) as ch:  # no token
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.DecisionsStub(ch).RegisterInstances(pb.RegisterInstancesRequest(), timeout=30)
        assert e.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def test_a_batch_is_stored_and_survives_a_restart(served, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`policyc serve` keeps its registry in the embedded store (the state dir): a batch is
    written there, not only held in memory."""
    _, bundle, _ = served
    proc, server = _serve(tmp_path, bundle)
    try:
        with operator_channel(server) as ch:
            stub = pb_grpc.DecisionsStub(ch)
            pairs = _slots(stub, bundle, tpm=False)[:20]
            items = [_item(f"stored-{n}", m, dep, score=0.5) for n, (m, dep) in enumerate(pairs)]
            got = stub.RegisterInstances(pb.RegisterInstancesRequest(instances=items), timeout=60)
            assert got.registered == len(items) > 0, [r.message for r in got.results if not r.registered]
    finally:
        _stop(proc)
    proc, server = _serve(tmp_path, bundle)
    try:
        with operator_channel(server) as ch:
            assert {i.id for i in items} <= _listed(pb_grpc.DecisionsStub(ch))
    finally:
        _stop(proc)


def test_cli_registers_a_json_lines_file_in_one_call_naming_refused_lines(served, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server, bundle, _ = served
    with operator_channel(server) as ch:
        pairs = _slots(pb_grpc.DecisionsStub(ch), bundle)[-3:]
    # host and GPU only: the other facts come from the service's topology, as for one registration
    lines = [json.dumps({"id": f"cli-{n}", "model": m, "deployment": {"host": d.host, "gpu": d.gpu}})
             for n, (m, d) in enumerate(pairs)]
    lines.insert(1, json.dumps({"id": "cli-unknown", "model": "no-such-contract",
                                "deployment": {"host": pairs[0][1].host, "gpu": pairs[0][1].gpu}}))
    f = tmp_path / "fleet.jsonl"
    f.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLICYC_")}
    r = subprocess.run([*CLI, "instance", "register", "--file", str(f), "--server", server], capture_output=True,
                       text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == Exit.REFUSED, r.stderr
    assert f"{f}:2: cli-unknown:" in r.stderr and "no-such-contract" in r.stderr
    assert f"registered {len(pairs)} of {len(lines)} from {f}" in r.stdout
    with operator_channel(server) as ch:
        assert {f"cli-{n}" for n in range(len(pairs))} <= _listed(pb_grpc.DecisionsStub(ch))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\n" + '{"id": "x", "deployment": {"numa_node": "zero"}}\n')
    r = subprocess.run([*CLI, "instance", "register", "--file", str(bad), "--server", server], capture_output=True,
                       text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == Exit.USAGE and f"{bad}:2: not a RegisterInstanceRequest" in r.stderr, r.stderr
