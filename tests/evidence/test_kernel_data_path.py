"""The kernel plane on the real data path, as `policyc gateway --enforcer kernel` puts it:
TC on loopback counts the traffic Envoy sends the model servers (agreeing with Envoy's own
access-log figures), a quarantine sends Envoy's new upstream connections to the backup,
and stop leaves no filter and no cgroup hook behind. Root and BPF, as in CI."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from evidence_support import EvidenceRig, signal_events
from gateway_rig import BACKUP, PRIMARY
from test_gateway_accounting import BASE, IDS, accounting_of

from policyc.audit.query import AuditReader
from policyc.audit.records import EntryKind
from policyc.compiler.bundle import Bundle
from policyc.enforcer.correlate import STREAM_TIME
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_plane import monotonic_deadline_ns
from policyc.modelserver.client import OipClient
from policyc.server.config import EnforcerMode


def our_tc_filters() -> str:
    out = ""
    for hook in ("ingress", "egress"):
        out += subprocess.run(["tc", "filter", "show", "dev", "lo", hook], capture_output=True, text=True).stdout
    return out


@pytest.fixture(scope="module")
def krig(bundle: Bundle) -> Iterator[EvidenceRig]:
    r = EvidenceRig(bundle, Path(tempfile.mkdtemp(prefix="policyc-kernel-path-")), enforcer=EnforcerMode.KERNEL)
    yield r
    r.stop()


def endpoint_of(rig: EvidenceRig, model: str) -> Endpoint:
    [slot] = [s for s in rig.slots if s.model == model]
    return Endpoint.parse(rig.models.endpoint(slot.instance_id))


def test_gateway_attached_tc_and_connect_hooks_and_registered_the_pool(krig: EvidenceRig) -> None:
    dp = krig.gateway.data_path
    assert dp is not None and dp.cgroup is not None
    assert "tc_ingress" in our_tc_filters() and "tc_egress" in our_tc_filters()
    hooks = subprocess.run(["bpftool", "cgroup", "show", str(dp.cgroup)], capture_output=True, text=True).stdout
    assert "connect4" in hooks and "connect6" in hooks
    envoy_pid = krig.gateway.envoy.pid  # type: ignore[union-attr]
    assert str(envoy_pid) in (dp.cgroup / "cgroup.procs").read_text().split()
    assert dp.backends()[endpoint_of(krig, PRIMARY)] == endpoint_of(krig, BACKUP)


def test_tc_counts_the_traffic_envoy_measured(krig: EvidenceRig) -> None:
    g = krig.thread.server.guardian
    assert g is not None
    primary = endpoint_of(krig, PRIMARY)
    bid = g.backend_id(primary)
    assert bid is not None
    plane = g.plane
    before = plane.backend_counters(bid, "egress", True).payload  # type: ignore[attr-defined]
    with OipClient(krig.listen) as client:
        answers = [client.infer(PRIMARY, IDS, metadata=BASE, timeout=10) for _ in range(5)]
    assert all(a.instance.startswith(PRIMARY) for a in answers)
    envoy_sent = sum(accounting_of(krig, a.decision_id)["detail"]["attempts"][0]["sent"] for a in answers)
    kernel_sent = plane.backend_counters(bid, "egress", True).payload - before  # type: ignore[attr-defined]
    # TCP payload toward the model server as TC saw it vs Envoy's upstream wire bytes for
    # these calls: the kernel also sees the connection's own frames (SETTINGS, WINDOW_UPDATE,
    # PING), never less
    assert envoy_sent > 0 and kernel_sent >= envoy_sent * 0.98, (kernel_sent, envoy_sent)
    assert kernel_sent <= envoy_sent * 1.5 + 4096, (kernel_sent, envoy_sent)
    print(f"\nagreement kernel/envoy bytes to the model server: {kernel_sent}/{envoy_sent} = {kernel_sent / envoy_sent:.4f}")
    k, e = krig.gateway.byte_agreement()[str(primary)]  # the gateway's own cross-check, since it attached
    assert e > 0 and 0.98 <= k / e <= 1.5, (k, e)


def test_quarantine_moves_envoys_new_upstream_connections_to_the_backup(krig: EvidenceRig) -> None:
    g = krig.thread.server.guardian
    assert g is not None
    primary, backup = endpoint_of(krig, PRIMARY), endpoint_of(krig, BACKUP)
    plane = g.plane
    plane.quarantine(primary, backup, 0, monotonic_deadline_ns(3.0))
    plane.end_connections(primary)  # Envoy's established connection ends; its next one is new
    try:
        with OipClient(krig.listen) as client:
            a = client.infer(PRIMARY, IDS, metadata=BASE, timeout=10)
        pick = krig.gateway.picker.picker.recent[a.decision_id]
        assert pick.endpoint == str(primary)  # Envoy was told the primary ...
        assert a.instance.startswith(BACKUP)  # ... and the kernel connected it to the backup
    finally:
        plane.release(primary)
        plane.end_connections(primary)
    time.sleep(0.1)
    with OipClient(krig.listen) as client:
        b = client.infer(PRIMARY, IDS, metadata=BASE, timeout=10)
    assert b.instance.startswith(PRIMARY)  # released: new connections reach the primary again


def test_the_walkers_per_stream_http2_times_reach_the_signal_windows(krig: EvidenceRig) -> None:
    """Each upstream HTTP/2 stream the TC walker saw end becomes a `stream_time` event on the
    GPU of the model server it went to, agreeing with Envoy's own time for the attempt."""
    windows, g = krig.gateway.signals, krig.thread.server.guardian
    assert windows is not None and g is not None and krig.gateway.kernel_streams is not None
    g.plane.drain()  # type: ignore[attr-defined]  # stream ends of earlier tests' calls (collected every few ms)
    with signal_events(windows) as seen:
        with OipClient(krig.listen) as client:
            answers = [client.infer(PRIMARY, IDS, metadata=BASE, timeout=10) for _ in range(5)]
        attempts = [accounting_of(krig, a.decision_id)["detail"]["attempts"][0] for a in answers]
        g.plane.drain()  # type: ignore[attr-defined]
    [gpu] = {krig.gateway._gpu_of(a.instance) for a in answers}
    streams = [v for k, sig, v in seen if sig == STREAM_TIME and k == gpu]
    assert len(streams) == len(answers), (streams, seen)  # one per call: each call was one upstream stream
    envoy = sorted(a["duration"] for a in attempts)
    kernel = sorted(streams)
    # the kernel times the stream from its HEADERS to the last END_STREAM on the wire; Envoy from
    # the attempt's start to its end: the same stream, within a few ms on loopback
    assert all(0 < k <= e + 0.005 for k, e in zip(kernel, envoy)), (kernel, envoy)
    print(f"\nstream time kernel/envoy median: {kernel[2] * 1e3:.3f}/{envoy[2] * 1e3:.3f} ms")


def test_stop_detaches_everything(krig: EvidenceRig) -> None:  # last: it stops the module's gateway
    dp = krig.gateway.data_path
    assert dp is not None and dp.cgroup is not None
    cgroup = dp.cgroup
    krig.stop()
    with AuditReader.open(krig.workdir / "audit.db") as reader:
        checks = [e.record for e in reader.entries(kind=EntryKind.ACTION) if e.record.target == "kernel cross-check"]
    assert len(checks) == 1 and "kernel_payload" in checks[0].detail  # the agreement is in the audit log
    assert "tc_ingress" not in our_tc_filters() and "tc_egress" not in our_tc_filters()
    assert not cgroup.exists()
    tree = subprocess.run(["bpftool", "cgroup", "tree"], capture_output=True, text=True).stdout
    assert cgroup.name not in tree
