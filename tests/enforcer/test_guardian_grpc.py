"""Four concurrent gRPC streams on one connection: the guardian breaks only the slow one.

Runs on the user-space plane (no root needed): breaking a stream is a user-space act.
"""

from __future__ import annotations

import threading
import warnings

import grpc

from enforcer_support import make_bundle  # noqa: E402
from grpc_rig import start_server, stub  # noqa: E402

from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.executor import ActionExecutor
from policyc.enforcer.guardian import Guardian, RetryPlan
from policyc.enforcer.records import ActionKind, Outcome
from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane


class Anomalies:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, float]] = []

    def report_anomaly(self, gpu_key: str, signal: str, value: float) -> None:
        self.reports.append((gpu_key, signal, value))


def test_guardian_breaks_one_of_four_streams_and_retries_it_on_backup() -> None:
    cancelled: list[str] = []
    primary, p_port = start_server("primary", cancelled=cancelled)
    backup, b_port = start_server("backup")
    audit = MemoryAudit()
    anomalies = Anomalies()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelEnforcementOff)
        plane = UserSpacePlane(audit, reason="test")
    guardian = Guardian(make_bundle(), plane=plane, anomalies=anomalies, audit=audit,
                        executor=ActionExecutor(audit, rebalance=lambda node: None))
    channel = grpc.insecure_channel(f"127.0.0.1:{p_port}")
    backup_channel = grpc.insecure_channel(f"127.0.0.1:{b_port}")
    call, call_backup = stub(channel), stub(backup_channel)
    grpc.channel_ready_future(channel).result(timeout=5)
    results: dict[str, str] = {}
    retried = threading.Event()

    def retry(plan: RetryPlan) -> None:
        def run() -> None:
            guardian.finish(plan.request_id)
            guardian.begin(plan.request_id, "fraud-scorer", _Noop(), retry_count=1)
            md = (*plan.headers, ("x-variant", plan.variant or ""), ("request-id", plan.request_id))
            results[plan.request_id] = call_backup(b"10", metadata=md, timeout=5).decode()
            guardian.finish(plan.request_id)
            retried.set()

        threading.Thread(target=run).start()

    delays = {"r0": "40", "r1": "60", "r2": "2000", "r3": "80"}
    futures = {}
    for rid, delay in delays.items():
        fut = call.future(delay.encode(), metadata=(("request-id", rid),), timeout=10)
        futures[rid] = fut
        guardian.begin(rid, "fraud-scorer", fut, gpu_key="host-a/gpu0", on_redirect=retry)
        # a stream leaves the guardian's watch the moment it completes, as a server's would
        fut.add_done_callback(lambda f, rid=rid: None if f.cancelled() else guardian.finish(rid))
    for rid, fut in futures.items():
        try:
            results[rid] = fut.result().decode()
        except grpc.FutureCancelledError:
            pass
    assert retried.wait(5)
    assert [results[r] for r in ("r0", "r1", "r3")] == ["primary||0"] * 3
    assert futures["r2"].cancelled()
    assert results["r2"] == "backup|simplified|1"
    kinds = [(r.kind, r.outcome) for r in audit.records if r.rule == "slo-budget" and r.kind is not ActionKind.MAP_CHANGE]
    assert kinds == [(ActionKind.CANCEL_STREAM, Outcome.DONE), (ActionKind.REDIRECT, Outcome.DONE), (ActionKind.REPORT_ANOMALY, Outcome.DONE)]
    assert [a[:2] for a in anomalies.reports] == [("host-a/gpu0", "elapsed")]
    assert 0.185 <= anomalies.reports[0][2] < 0.25
    assert guardian.break_timings and guardian.break_timings[0].cancel_s < 0.02
    # the connection survived: a new call on the same channel still reaches the primary
    assert call(b"0", timeout=5).decode() == "primary||0"
    guardian.close()
    channel.close()
    backup_channel.close()
    primary.stop(0)
    backup.stop(0)


class _Noop:
    def cancel(self) -> bool:
        return False
