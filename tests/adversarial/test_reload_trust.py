"""One trust policy on every load path: start, ReloadBundle(bundle_json), ReloadBundle(path), SIGHUP.

A server started with `--public-key` refuses an unsigned bundle and a signed bundle the
compiler would have refused (efficiency −1), on each path; the old bundle keeps serving,
the refusal says why, is counted and is in the audit log. A FIFO given as the reload path
is refused at once and Decide never waits for it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.client import operator_channel
from policyc.audit.query import AuditReader
from policyc.audit.records import EntryKind
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.proto import pb, pb_grpc

REPO = Path(__file__).resolve().parents[2]
SMALL = ClusterSpec(seed=1, hosts=4, gpus_per_host=2, hosts_per_rack=2)
PY = sys.executable


def _with(bundle: Bundle, **changes: object) -> Bundle:
    return bundle.model_copy(update=changes)


@pytest.fixture(scope="module")
def keys() -> tuple[Ed25519PrivateKey, Ed25519PrivateKey]:
    return Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def bundles(keys: tuple[Ed25519PrivateKey, Ed25519PrivateKey]) -> dict[str, Bundle]:
    trusted, stranger = keys
    r = compile_paths([str(REPO / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    base = r.bundle
    c0 = base.contracts[0]
    bad_contract = c0.model_copy(update={"compute": c0.compute.model_copy(update={"efficiency": -1.0})})
    bad = _with(base, contracts=(bad_contract,) + base.contracts[1:])
    return {
        "start": bundle_io.sign(base, trusted),
        "next": bundle_io.sign(_with(base, compiler_version="next"), trusted),
        "unsigned": bundle_io.seal(_with(base, compiler_version="unsigned")),
        "stranger": bundle_io.sign(_with(base, compiler_version="stranger"), stranger),
        "signed-invalid": bundle_io.sign(bad, trusted),  # signed by the operator's key, refused by the compiler's checks
    }


@pytest.fixture(scope="module")
def served(bundles: dict[str, Bundle], keys: tuple[Ed25519PrivateKey, Ed25519PrivateKey],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    audit = tmp_path_factory.mktemp("trust") / "audit.db"
    cfg = ServeConfig(cluster=SMALL, start_refresher=False, enforcer=EnforcerMode.OFF, audit_log=audit,
                      bundle_key=keys[0].public_key())
    th = ServerThread(DecisionServer(bundles["start"], cfg))
    th.start()
    yield th, audit
    th.stop()


def _stub(th: ServerThread) -> tuple[grpc.Channel, pb_grpc.DecisionsStub]:
    ch = operator_channel(f"127.0.0.1:{th.server.port}")
    return ch, pb_grpc.DecisionsStub(ch)


@pytest.mark.parametrize("name, why", [
    ("unsigned", "not signed"),
    ("stranger", "signature does not verify"),
    ("signed-invalid", r"bundle refused: .*error\[E305\]: `efficiency`"),
])
@pytest.mark.parametrize("via", ["bundle_json", "path"])
def test_reload_refuses_what_the_start_would_refuse(served, bundles, tmp_path, name: str, why: str, via: str) -> None:
    th, _ = served
    before = th.server.state.bundle_hash
    text = bundle_io.dumps(bundles[name])
    if via == "path":
        p = tmp_path / f"{name}.json"
        p.write_text(text)
        req = pb.ReloadBundleRequest(path=str(p))
    else:
        req = pb.ReloadBundleRequest(bundle_json=text)
    ch, stub = _stub(th)
    with ch, pytest.raises(grpc.RpcError) as e:
        stub.ReloadBundle(req, timeout=60)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(why, e.value.details()), e.value.details()
    assert th.server.state.bundle_hash == before  # the old bundle keeps serving


def test_a_signed_valid_bundle_is_accepted_and_both_outcomes_are_audited(served, bundles) -> None:
    th, audit = served
    ch, stub = _stub(th)
    with ch:
        with pytest.raises(grpc.RpcError):
            stub.ReloadBundle(pb.ReloadBundleRequest(bundle_json=bundle_io.dumps(bundles["unsigned"])), timeout=60)
        r = stub.ReloadBundle(pb.ReloadBundleRequest(bundle_json=bundle_io.dumps(bundles["next"])), timeout=60)
    assert r.bundle_hash == bundles["next"].content_hash == th.server.state.bundle_hash
    assert th.server.audit is not None
    th.server.audit.flush()
    details: list[str] = []
    for _ in range(100):  # the writer makes records durable within a group-commit window
        with AuditReader.open(audit) as reader:
            details = [e.record.detail for e in reader.entries(kind=EntryKind.ACTION, limit=10_000)  # type: ignore[union-attr]
                       if e.record.kind == "bundle_reload" and e.record.target == "bundle"]  # type: ignore[union-attr]
        if any("accepted (ReloadBundle)" in d for d in details) and any("refused (ReloadBundle)" in d for d in details):
            break
        time.sleep(0.05)
    assert any("bundle reload refused (ReloadBundle)" in d and "not signed" in d for d in details), details
    assert any("bundle reload accepted (ReloadBundle)" in d for d in details), details


def test_a_fifo_reload_path_is_refused_and_never_stalls_decide(served, tmp_path) -> None:
    th, _ = served
    fifo = tmp_path / "bundle.fifo"
    os.mkfifo(fifo)
    ch, stub = _stub(th)
    with ch:
        t0 = time.perf_counter()
        with pytest.raises(grpc.RpcError) as e:
            stub.ReloadBundle(pb.ReloadBundleRequest(path=str(fifo)), timeout=10)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "FIFO" in e.value.details()
        assert time.perf_counter() - t0 < 5
        for bad in ("/dev/zero", "/proc/self/mem", str(tmp_path)):
            with pytest.raises(grpc.RpcError) as e:
                stub.ReloadBundle(pb.ReloadBundleRequest(path=bad), timeout=10)
            assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT, bad


def _wait_for(stream_lines: list[str], pattern: str, timeout: float = 60, after: int = 0) -> re.Match[str]:
    """The first line from index `after` on that matches, waiting for the server to write it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(stream_lines)[after:]:
            if (m := re.search(pattern, line)) is not None:
                return m
        time.sleep(0.05)
    raise AssertionError(f"no line matching {pattern!r} in {stream_lines}")


def test_sighup_applies_the_same_policy(bundles, keys, tmp_path) -> None:
    from cryptography.hazmat.primitives import serialization

    pub = tmp_path / "op.pub"
    pub.write_bytes(keys[0].public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    path = tmp_path / "bundle.json"
    bundle_io.write(bundles["start"], path)
    proc = subprocess.Popen([PY, "-m", "policyc.cli.main", "serve", "--bundle", str(path), "--public-key", str(pub),
                             "--port", "0", "--enforcer", "off", "--sim-hosts", "4", "--sim-gpus-per-host", "2"],
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        _wait_for(lines, r"listening on 127\.0\.0\.1:(\d+)")
        for name, why in (("unsigned", "not signed"), ("signed-invalid", "efficiency"), ("stranger", "does not verify")):
            bundle_io.write(bundles[name], path)
            n = len(lines)
            proc.send_signal(signal.SIGHUP)
            _wait_for(lines, rf"reload refused, still serving {bundles['start'].content_hash[:19]}.*{why}", after=n)
        bundle_io.write(bundles["next"], path)
        proc.send_signal(signal.SIGHUP)
        _wait_for(lines, rf"reloaded .*{bundles['next'].content_hash[:19]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not any("Traceback" in line for line in lines), lines


def test_start_refuses_an_unsigned_bundle_with_exit_2(bundles, keys, tmp_path) -> None:
    from cryptography.hazmat.primitives import serialization

    pub = tmp_path / "op.pub"
    pub.write_bytes(keys[0].public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    for name, why in (("unsigned", "not signed"), ("signed-invalid", "efficiency")):
        path = tmp_path / f"{name}.json"
        bundle_io.write(bundles[name], path)
        r = subprocess.run([PY, "-m", "policyc.cli.main", "serve", "--bundle", str(path), "--public-key", str(pub), "--port", "0"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
