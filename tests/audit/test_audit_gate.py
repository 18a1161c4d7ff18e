"""The audit gate in a running decision service (in process, real gRPC): sync mode answers
only what is on disk; a full disk makes Decide refuse and nothing unlogged is acknowledged;
a hung writer closes the gate after the window and a recovered one reopens it; a queue for
the writer past its limit closes it too, naming the log."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import time
import warnings
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.server.app import DecisionServer, ServerThread
from policyc.server.config import AuditDurability, ClusterSpec, EnforcerMode, ServeConfig
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

REPO = Path(__file__).resolve().parents[2]
REQ = pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"})
WINDOW = 0.3


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    warnings.simplefilter("ignore")
    b = compile_paths([str(REPO / "policies")], analyse=False).bundle
    assert b is not None
    return b


def _serve(bundle: Bundle, log: Path, mode: AuditDurability) -> ServerThread:
    server = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4), audit_log=log,
                                                audit_durability=mode, audit_window=WINDOW, enforcer=EnforcerMode.OFF,
                                                watch_gpus=False))
    assert server.cluster is not None
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots()))
    th = ServerThread(server)
    th.start()
    return th


def _health(port: int) -> int:
    with operator_channel(f"127.0.0.1:{port}") as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="")).status


def _wait_not_serving(port: int) -> None:
    deadline = time.monotonic() + 1.0
    while _health(port) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline, "health stayed SERVING while the audit gate was closed"
        time.sleep(0.01)


def _ids(log: Path) -> set[str]:
    with sqlite3.connect(f"{log.resolve().as_uri()}?mode=ro", uri=True) as db:
        return {r[0] for r in db.execute("SELECT decision_id FROM entries WHERE kind = 'decision'")}


def test_sync_mode_answers_only_decisions_already_on_disk(bundle: Bundle, tmp_path: Path) -> None:
    log = tmp_path / "audit.db"
    th = _serve(bundle, log, AuditDurability.SYNC)
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for _ in range(30):
                d = stub.Decide(REQ, timeout=5)
                assert d.decision_id in _ids(log)  # committed before the answer left
    finally:
        th.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of its own (root, as in CI): a disk that fills up."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    d = tmp_path / "disk"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.parametrize("mode", [AuditDurability.SYNC, AuditDurability.GROUP])
def test_a_full_disk_closes_the_gate_and_nothing_unlogged_is_acknowledged(bundle: Bundle, small_disk: Path, mode: AuditDurability) -> None:
    log = small_disk / "audit.db"
    th = _serve(bundle, log, mode)
    acked: list[str] = []
    refusal = ""
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            deadline = time.monotonic() + 30
            while not refusal:
                assert time.monotonic() < deadline, "the disk never filled"
                try:
                    acked.append(stub.Decide(REQ, timeout=5).decision_id)
                except grpc.RpcError as e:
                    assert e.code() is grpc.StatusCode.UNAVAILABLE, e.details()
                    refusal = e.details() or ""
            assert str(log) in refusal
            with pytest.raises(grpc.RpcError) as again:  # sticky: no half-working audit log
                stub.Decide(REQ, timeout=5)
            assert again.value.code() is grpc.StatusCode.UNAVAILABLE and "could not be stored" in (again.value.details() or "")
        _wait_not_serving(th.server.port)
        audit = th.server.audit
        assert audit is not None and audit.lost > 0
        lost = [i for i in acked if i not in _ids(log)]
        if mode is AuditDurability.SYNC:
            assert not lost and audit.acknowledged_lost == 0
        else:  # group: the decisions of the batch the disk refused were already answered; they are counted
            assert audit.acknowledged_lost == len(lost) > 0
    finally:
        th.stop()


def test_a_hung_writer_closes_the_gate_after_the_window_and_recovery_reopens_it(bundle: Bundle, tmp_path: Path) -> None:
    th = _serve(bundle, tmp_path / "audit.db", AuditDurability.GROUP)
    audit = th.server.audit
    assert audit is not None
    pid = audit.log._proc.pid
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            stub.Decide(REQ, timeout=5)
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            while True:
                try:
                    stub.Decide(REQ, timeout=5)
                except grpc.RpcError as e:
                    assert e.code() is grpc.StatusCode.UNAVAILABLE and "has not made a record durable" in (e.details() or "")
                    break
                time.sleep(0.005)
            took = time.monotonic() - stopped
            # the window runs from the oldest decision not yet durable, which may predate the stop by a flush interval
            assert WINDOW - 0.1 <= took <= WINDOW + 1.0, took  # (+1 s: a shared, loaded CI machine's scheduling)
            _wait_not_serving(th.server.port)
            os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            while audit.refusal() is not None:
                assert time.monotonic() < deadline, audit.refusal()
                time.sleep(0.01)
            stub.Decide(REQ, timeout=5)  # caught up: admitting again, nothing lost
            assert audit.lost == 0 and audit.acknowledged_lost == 0
    finally:
        os.kill(pid, signal.SIGCONT)
        th.stop()


def test_a_full_queue_for_the_writer_closes_the_gate_naming_the_log(bundle: Bundle, tmp_path: Path) -> None:
    """The writer stalls (SIGSTOP) while records keep coming: once more than QUEUE_LIMIT bytes
    wait for it, Decide is refused with UNAVAILABLE naming the log, before the durability
    window (a minute here) would close the gate; when the writer resumes it catches up, every
    queued record is stored and Decide admits again."""
    from policyc.audit.records import ActionRecord
    from policyc.server.audit_bridge import QUEUE_LIMIT

    log_path = tmp_path / "audit.db"
    server = DecisionServer(bundle, ServeConfig(cluster=ClusterSpec(seed=1, hosts=8, gpus_per_host=4), audit_log=log_path,
                                                audit_durability=AuditDurability.GROUP, audit_window=60.0,
                                                enforcer=EnforcerMode.OFF, watch_gpus=False))
    assert server.cluster is not None
    server.engine.register_many(admissible_fleet(bundle, server.cluster.gpu_slots()))
    th = ServerThread(server)
    th.start()
    audit = th.server.audit
    assert audit is not None
    pid = audit.log._proc.pid
    filler = "x" * 16_000  # an accounting record's detail can be this long (many attempts)
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            stub.Decide(REQ, timeout=5)
            os.kill(pid, signal.SIGSTOP)
            receipts, deadline = [], time.monotonic() + 20

            def fill(past: int) -> None:
                while audit.log.queued_bytes <= past:
                    assert time.monotonic() < deadline, audit.log.queued_bytes
                    receipts.append(audit.log.submit_action(ActionRecord(time=time.time(), kind="accounting", target="h",
                                                                         outcome="done", dry_run=False, detail=filler)))

            while True:  # until the sender thread has filled the stopped writer's pipe: what is queued then stays
                fill(QUEUE_LIMIT + (256 << 10))  # under the 4 MiB at which the log blocks submitters
                before = audit.log.queued_bytes
                time.sleep(0.2)
                if audit.log.queued_bytes == before:
                    break
            with pytest.raises(grpc.RpcError) as e:
                stub.Decide(REQ, timeout=5)
            assert e.value.code() is grpc.StatusCode.UNAVAILABLE
            details = e.value.details() or ""
            assert f"audit log {log_path} is behind" in details and "KiB of records wait for its writer" in details, details
            _wait_not_serving(th.server.port)
            os.kill(pid, signal.SIGCONT)
            for r in receipts:
                r.wait()
            deadline = time.monotonic() + 10
            while audit.refusal() is not None:
                assert time.monotonic() < deadline, audit.refusal()
                time.sleep(0.01)
            stub.Decide(REQ, timeout=5)  # caught up: admitting again, nothing lost
            assert audit.lost == 0 and audit.acknowledged_lost == 0 and audit.log.failures == 0
            print(f"\nthe gate closed after {len(receipts)} queued records: {details}")
    finally:
        os.kill(pid, signal.SIGCONT)
        th.stop()
