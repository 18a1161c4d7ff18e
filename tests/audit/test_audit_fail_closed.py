"""Fault injection against a real `policyc serve` under Decide load: the audit log fails
closed, and acknowledged-but-lost decisions are counted from what the client was told.

- kill -9 of the server: 0 acknowledged decisions lost in sync mode; in group mode every
  lost one was acknowledged within the documented window before the kill, and `verify`
  reports where the durable log ends;
- kill -9 of the audit writer: Decide refuses (UNAVAILABLE, naming the audit log) within
  one group-commit window, health goes NOT_SERVING, the metrics say so, and stop exits 1.
"""

from __future__ import annotations

import os
import re
import signal
import time
import warnings
from pathlib import Path

import grpc
import pytest
from audit_serve_rig import Client, Serve, logged_ids, write_bundle
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from grpc_health.v1 import health_pb2, health_pb2_grpc

from policyc.client import operator_channel
from policyc.audit.verify import verify
from policyc.cli.keys import generate, load_public
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.server.audit_bridge import WINDOW

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    warnings.simplefilter("ignore")
    b = compile_paths([str(REPO / "policies")], analyse=False).bundle
    assert b is not None
    return b


@pytest.fixture(scope="module")
def files(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("serve")
    generate(str(d / "audit.key"), str(d / "audit.pub"))
    return {"bundle": write_bundle(bundle, d / "bundle.json"), "key": d / "audit.key", "pub": d / "audit.pub"}


def _run_and_kill_server(mode: str, bundle: Bundle, files: dict[str, Path], log: Path) -> tuple[dict[str, float], float, list[float]]:
    serve = Serve.start(files["bundle"], log, "--audit-durability", mode, "--audit-key", str(files["key"]), bundle_obj=bundle)
    client = Client(serve.port)
    try:
        client.wait_for(400)
        killed = time.monotonic()
        serve.kill()  # mid-stream: six client threads are deciding right now
    finally:
        client.close()
        serve.kill()
    closed = [r.at for r in client.refusals if "audit log" in r.details and r.at < killed]  # the gate shut before the kill
    return client.acked, killed, closed


@pytest.mark.parametrize("mode", ["sync", "group"])
def test_kill_9_of_the_server_loses_no_acknowledged_decision_beyond_the_window(mode: str, bundle: Bundle, files: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    log = tmp_path / "audit.db"
    acked, killed, gate_closed = _run_and_kill_server(mode, bundle, files, log)
    report = verify(log, public_key=load_public(str(files["pub"])))
    assert report.ok, report.problems  # a crash is not tampering: the chain and the signed checkpoints check out
    assert not report.closed and any("does not end with a close record" in n for n in report.notes), report.notes
    assert report.durable_end == report.last_seq and report.durable_end >= len(logged_ids(log))
    lost = {i: t for i, t in acked.items() if i not in logged_ids(log)}
    if mode == "sync":
        assert not lost, f"sync mode lost {len(lost)} acknowledged decision(s)"
    else:  # group: only decisions acknowledged within the window before the kill may be lost (or before the
        # writer stalled for longer than the window, which the client then saw as the gate closing)
        late = {i: killed - t for i, t in lost.items() if killed - t > WINDOW and not any(c >= t + WINDOW - 0.05 for c in gate_closed)}
        assert not late, f"lost decisions acknowledged {max(late.values()):.3f} s before the kill (window {WINDOW} s)"
    print(f"{mode}: {len(acked)} acknowledged, {len(lost)} lost"
          + (f" (acknowledged at most {max(killed - t for t in lost.values()) * 1000:.0f} ms before the kill)" if lost else ""))


def test_kill_9_of_the_writer_makes_decide_refuse_within_one_window(bundle: Bundle, files: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "audit.db"
    serve = Serve.start(files["bundle"], log, bundle_obj=bundle)  # group mode, the default
    client = Client(serve.port)
    try:
        client.wait_for(300)
        with operator_channel(f"127.0.0.1:{serve.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            assert health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
            assert "policyc_audit_healthy 1.0" in serve.metrics()
            killed = time.monotonic()
            os.kill(serve.writer_pid(), signal.SIGKILL)
            refusal = client.first_refusal_after(killed)
            took = refusal.at - killed
            assert refusal.code is grpc.StatusCode.UNAVAILABLE and str(log) in refusal.details and "audit writer" in refusal.details
            # typically a few ms (the acknowledgement pipe's end is seen at once; 188 ms seen at load 9.5 on 2 vCPUs).
            # What the window guarantees, whatever the load: no call made more than a window after the death is
            # acknowledged (checked below, once the gate has closed). The first refusal as this client's threads
            # see it also waits for them to be scheduled: a window, or a second more on a loaded machine.
            assert took <= WINDOW + 1.0, f"first refusal {took * 1000:.1f} ms after the writer died"
            deadline = time.monotonic() + 2
            while health.Check(health_pb2.HealthCheckRequest(service="")).status != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, "health stayed SERVING after the audit writer died"
                time.sleep(0.01)
            after = len(client.acked)
            time.sleep(0.2)
            assert len(client.acked) == after, "decisions were acknowledged after the audit writer died"
            late = sorted(s - killed for s in client.acked_sent.values() if s > killed + WINDOW)
            assert not late, f"calls made {late[:3]} s after the writer died were acknowledged (window {WINDOW} s)"
        text = serve.metrics()
        assert "policyc_audit_healthy 0.0" in text
        client.close()
        lost_ids = {i for i in client.acked if i not in logged_ids(log)}
        # the service counts what it never saw confirmed: at least what the client lost (a writer killed
        # between its commit and its acknowledgement stored a batch the service cannot know of)
        counted = float(re.search(r"^policyc_audit_acknowledged_lost_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
        assert counted >= len(lost_ids), (counted, len(lost_ids))
        code = serve.stop()
        assert code == 1, "".join(serve.stderr)
        assert any("did not close cleanly" in line and f"{int(counted)} of them decisions already acknowledged" in line
                   for line in serve.stderr), "".join(serve.stderr)
    finally:
        client.close()
        serve.kill()
    report = verify(log)
    assert report.ok and not report.closed
    print(f"writer killed: first refusal after {took * 1000:.1f} ms; {len(lost_ids)} acknowledged decision(s) lost "
          f"(group mode, within {WINDOW} s), log ends at entry {report.durable_end}")


def test_clean_stop_writes_the_signed_close_record(bundle: Bundle, files: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "audit.db"
    serve = Serve.start(files["bundle"], log, "--audit-key", str(files["key"]), bundle_obj=bundle)
    client = Client(serve.port, threads=2)
    try:
        client.wait_for(50)
        client.close()
        assert serve.stop() == 0, "".join(serve.stderr)
    finally:
        client.close()
        serve.kill()
    assert set(client.acked) <= logged_ids(log)
    report = verify(log, public_key=load_public(str(files["pub"])), expect_closed=True)
    assert report.ok and report.closed and report.last_checkpoint is not None and report.last_checkpoint.final
    assert report.last_checkpoint.signature is not None
    other = Ed25519PrivateKey.generate().public_key()
    assert not verify(log, public_key=other).ok  # signed by the operator's key, and by no other
