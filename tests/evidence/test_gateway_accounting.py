"""Measured per-call accounting from real traffic: calls through Envoy (as `policyc gateway`
runs it) each get one `accounting` record in the audit log, joined to the decision id,
with the bytes Envoy counted on the upstream wire and the model server's compute time;
a call broken and retried on the backup shows both attempts; `policyc audit report`'s
measured columns are filled."""

from __future__ import annotations

import json
import time
from typing import Any

import grpc
from evidence_support import EvidenceRig, signal_events
from gateway_rig import PRIMARY

from policyc.audit.query import AuditReader
from policyc.audit.render import explain_text
from policyc.enforcer.signal_windows import GatewaySignals
from policyc.modelserver.client import OipClient, infer_request, token_ids

IDS = token_ids(64)
BASE = (("x-model", PRIMARY), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"))
STALL = ("x-policyc-stall-ms", "5000")
FRAMING = 2048  # bytes of HTTP/2 frames, HPACK headers and the gRPC prefix a call may add on the wire


def answered(client: OipClient, metadata: tuple[tuple[str, str], ...] = BASE, timeout_s: float = 30.0) -> Any:
    """One call, answered. An earlier test's breaks (a loaded machine's calls over their 3x-predicted budget) report
    anomalies that lower the rig's one GPU's health for a moment (0.02 back a tick): a refusal naming that is
    waited out, as a client would retry; any other refusal is the test's failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.infer(PRIMARY, IDS, metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            if e.code() is not grpc.StatusCode.UNAVAILABLE or "health ruled out" not in (e.details() or "") \
                    or time.monotonic() > deadline:  # type: ignore[attr-defined]
                raise
            time.sleep(0.25)


def accounting_of(rig: EvidenceRig, decision_id: str, timeout: float = 5.0) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with AuditReader.open(rig.workdir / "audit.db") as reader:
            got = [e.record for e in reader.actions_for(decision_id) if e.record.kind == "accounting"]  # type: ignore[union-attr]
        if got:
            assert len(got) == 1, f"one accounting record per call, got {len(got)}"
            rec = got[0]
            return {"record": rec, "detail": json.loads(rec.detail)}  # type: ignore[union-attr]
        time.sleep(0.05)
    raise AssertionError(f"no accounting record for {decision_id} within {timeout} s")


def test_every_call_gets_one_measured_record_agreeing_with_what_was_sent(rig: EvidenceRig) -> None:
    request_bytes = infer_request(PRIMARY, IDS).ByteSize()
    counts = rig.gateway.access_log.receiver.counts  # type: ignore[union-attr]
    before = counts.entries
    with OipClient(rig.listen) as client:
        answers = [answered(client) for _ in range(5)]
    for a in answers:
        got = accounting_of(rig, a.decision_id)
        rec, detail = got["record"], got["detail"]
        assert rec.decision_id == a.decision_id and rec.resources.network_bytes.source == "measured"
        [attempt] = detail["attempts"]
        assert attempt["instance"] == a.instance and attempt["host"] == rig.models.endpoint(a.instance)
        # the upstream wire carried the request message and the answer, plus framing only
        assert request_bytes <= attempt["sent"] <= request_bytes + FRAMING, (attempt, request_bytes)
        assert a.logits.nbytes <= attempt["received"] <= a.logits.nbytes + FRAMING, (attempt, a.logits.nbytes)
        assert rec.resources.network_bytes.value == attempt["sent"] + attempt["received"]
        # compute time as the model server measured it, the figure its answer carried; it ran on
        # the CPU, so no GPU time was measured (the decision record holds the estimate)
        # the compute time: the kernel's count for the server's cgroup apportioned to the call once
        # the gateway samples that cgroup (audit/cgroup_cpu.py), before that the server's own
        # figure, measured; the server's own figure stays in the attempt's detail either way
        cpu = rec.resources.compute_seconds
        assert (cpu.source, cpu.method.split(":")[0]) in (("measured", "model server"), ("apportioned", "cgroup")), cpu
        assert cpu.source == "apportioned" or abs(cpu.value - a.compute_us / 1e6) < 1e-9
        assert attempt["compute_seconds"] == a.compute_us / 1e6 and a.compute_us > 0
        assert rec.resources.gpu_seconds is None
        assert detail["downstream"]["grpc_status"] == "0" and attempt["grpc_status"] == "0"
        # the answering attempt read from the call's entry: its times measured, within the call's
        assert 0 < attempt["first_byte"] <= attempt["duration"] <= detail["downstream"]["duration_s"]
    # one access-log entry per unbroken call: the router logs only the attempts Envoy broke
    assert counts.entries - before == len(answers)


def test_a_broken_and_retried_call_shows_both_attempts(rig: EvidenceRig) -> None:
    counts = rig.gateway.access_log.receiver.counts  # type: ignore[union-attr]
    before = counts.entries
    with OipClient(rig.listen) as client:
        a = answered(client, BASE + (STALL,))
    assert a.variant == "simplified"  # answered by the backup after the per-try timeout
    detail = accounting_of(rig, a.decision_id)["detail"]
    assert counts.entries - before == 2  # the call's entry and the broken attempt's
    first, second = detail["attempts"] if detail["attempts"][0]["compute_seconds"] is None else detail["attempts"][::-1]
    assert detail["attempts_expected"] == 2 and detail["attempts_missing"] == 0
    assert first["host"] != second["host"] and second["instance"] == a.instance
    assert first["sent"] > 0 and first["compute_seconds"] is None  # reset before it answered
    assert second["received"] >= a.logits.nbytes and second["compute_seconds"] == a.compute_us / 1e6
    # what an auditor reads (`policyc audit explain`): both attempts, their bytes summed, the answer's compute time
    with AuditReader.open(rig.workdir / "audit.db") as reader:
        text = explain_text(reader.explain(a.decision_id))  # type: ignore[arg-type]
    assert first["host"] in text and second["host"] in text
    assert f"network: {first['sent'] + first['received'] + second['sent'] + second['received']} bytes, measured" in text
    assert f"compute: {a.compute_us / 1e6:.6g} s, measured" in text


def test_the_report_shows_measured_network_and_compute_for_the_calls(rig: EvidenceRig) -> None:
    with OipClient(rig.listen) as client:
        a = answered(client)
    accounting_of(rig, a.decision_id)
    with AuditReader.open(rig.workdir / "audit.db") as reader:
        report = reader.report(by="model")
    row = next(r for r in report.rows if r.key == PRIMARY)
    assert row.network_bytes_measured > 0 and row.compute_seconds_measured + row.compute_seconds_apportioned > 0 and row.gpu_seconds_measured == 0


def test_upstream_connect_time_is_measured_and_reaches_the_signal_windows_once_per_connection(rig: EvidenceRig) -> None:
    """Envoy's TCP connect to the model server (US_CX_BEG..US_CX_END) rides on the answer into
    the access log; the windows get it as `connect_time`, once per upstream connection."""
    windows = rig.gateway.signals
    assert windows is not None
    with signal_events(windows) as seen:
        with OipClient(rig.listen) as client:
            answers = [answered(client) for _ in range(4)]
        details = [accounting_of(rig, a.decision_id)["detail"]["downstream"] for a in answers]
        time.sleep(0.3)  # the listener runs as each record settles; nothing further to wait for
    for d in details:
        assert d["upstream_connection"], d
        assert d["upstream_connect_s"] is not None and 0 < d["upstream_connect_s"] < d["duration_s"], d
    connects = [v for _, s, v in seen if s == "connect_time"]
    # each connection's connect counted at most once (the earlier tests' connections were counted then)
    assert len(connects) <= len({d["upstream_connection"] for d in details})
    assert all(any(abs(v - d["upstream_connect_s"]) < 1e-9 for d in details) for v in connects)
    # every connection these calls used has had its connect fed (now or by an earlier call)
    [listener] = [fn for fn in rig.gateway.access_log.receiver.listeners if isinstance(fn, GatewaySignals)]  # type: ignore[union-attr]
    assert {d["upstream_connection"] for d in details} <= set(listener._connections)
    # and the figure is the connection's, so every call over one connection reports the same
    by_conn: dict[str, set[float]] = {}
    for d in details:
        by_conn.setdefault(d["upstream_connection"], set()).add(d["upstream_connect_s"])
    assert all(len(v) == 1 for v in by_conn.values()), by_conn
