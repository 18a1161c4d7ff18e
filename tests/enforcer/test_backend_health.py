"""The backend breakers fed from the kernel's stream outcomes (`BackendHealth`), and the one
choice of a model server's quarantine target (`quarantine_targets`). No root needed: the
events are the kernel plane's own type, built here; the guardian is the real one."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from enforcer_support import REF, make_bundle

from policyc.compiler.bundle import Breaker, Quarantine, SignalCondition
from policyc.enforcer.backend_health import BackendHealth
from policyc.enforcer.backup_choice import quarantine_targets
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.executor import ActionExecutor
from policyc.enforcer.guardian import Guardian
from policyc.enforcer.kernel_abi import STREAM_F_RST, EventKind
from policyc.enforcer.kernel_events import KernelEvent
from policyc.enforcer.records import ActionKind, Outcome
from policyc.enforcer.rule_table import build_rule_table
from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane

CLIENT = Endpoint.parse("127.0.0.1:40000")
W = 500_000_000  # the default window, ns


def stream(server: Endpoint, reset: bool, ts_ns: int, kind: EventKind = EventKind.STREAM_DONE) -> KernelEvent:
    return KernelEvent(kind=kind, ts_ns=ts_ns, a=CLIENT, b=server, rule=0, op=None, stream_id=1,
                       flags=STREAM_F_RST if reset else 0, result=0, value=1_000_000, value2=ts_ns - 1_000_000)


def test_each_closed_window_is_one_observation_of_the_reset_share() -> None:
    seen: list[tuple[Endpoint, float]] = []
    health = BackendHealth(lambda b, s: seen.append((b, s["error_rate"])))
    a, b, other = (Endpoint.parse(f"127.0.0.1:{p}") for p in (9001, 9002, 9003))
    health.watch([a, b])
    for ev in (stream(a, True, 10 * W + 1), stream(a, False, 10 * W + 2), stream(a, True, 10 * W + 3),
               stream(a, True, 10 * W + 4), stream(b, False, 10 * W + 5), stream(other, True, 10 * W + 6),
               stream(a, True, 11 * W + 1), stream(a, True, 10 * W + 7, EventKind.H2_DESYNC)):
        health(ev)
    assert health.flush(11 * W) == 2  # window 10 closed; window 11 still open
    assert sorted(seen, key=str) == [(a, 0.75), (b, 0.0)]  # `other` is not watched; a desync is no stream end
    assert health.flush(11 * W + 5) == 0
    assert health.flush(12 * W) == 1 and seen[-1] == (a, 1.0)
    assert health.flush(20 * W) == 0  # a quiet window is no observation at all
    assert not any(math.isnan(v) for _, v in seen)


@dataclass
class _NoAnomalies:
    def report_anomaly(self, gpu_key: str, signal: str, value: float) -> None:
        pass


def _guardian(consecutive: int) -> tuple[Guardian, MemoryAudit]:
    """A guardian on the user-space plane with the shipped backend breaker's shape: error rate
    over 50 % for `consecutive` windows quarantines, at most half the backends at once."""
    rule = Breaker(name="failing-backend", scope="backend", consecutive=consecutive, origin=REF,
                   conditions=(SignalCondition(signal="error_rate", cmp=">", value=0.5, origin=REF),),
                   actions=(Quarantine(duration=30, max_duration=480, max_share=0.5),))
    audit = MemoryAudit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelEnforcementOff)
        plane = UserSpacePlane(audit, reason="test")
    g = Guardian(make_bundle(extra=(rule,)), plane=plane, anomalies=_NoAnomalies(), audit=audit,
                 executor=ActionExecutor(audit, rebalance=lambda _: None))
    return g, audit


def test_three_failing_windows_quarantine_the_backend_onto_its_backup() -> None:
    g, audit = _guardian(consecutive=3)
    try:
        sick, healthy, backup = (Endpoint.parse(f"127.0.0.1:{p}") for p in (9001, 9002, 9100))
        for be in (sick, healthy):
            g.register_backend(be, backup)
        health = BackendHealth(g.observe_backend)
        health.watch([sick, healthy])
        for w in (1, 2, 4):  # window 3 is quiet: the streak neither grows nor restarts
            for i in range(4):
                health(stream(sick, i < 3, w * W + i))
                health(stream(healthy, False, w * W + i))
            health.flush((w + 1) * W)
            done = [r for r in audit.records if r.kind is ActionKind.QUARANTINE and r.outcome is Outcome.DONE]
            assert bool(done) == (w == 4), (w, done)  # 75 % resets three windows in a row
        assert done[0].target == str(sick) and f"to {backup}" in done[0].detail
        assert g.plane.quarantined() == {sick: backup}
    finally:
        g.close()


@dataclass(frozen=True)
class _M:
    model: str
    endpoint: str
    gpu_key: str


class _Pool:
    def __init__(self, members: list[_M]) -> None:
        self._members = members

    def members(self, model: str | None = None) -> list[_M]:
        return [m for m in self._members if model is None or m.model == model]

    def fallbacks(self, model: str, avoid_endpoint: str, avoid_gpu: str, n: int = 1) -> list[_M]:
        c = [m for m in self.members(model) if m.endpoint != avoid_endpoint]
        c.sort(key=lambda m: m.gpu_key == avoid_gpu)
        return c[:n]


def test_the_quarantine_target_is_the_redirect_backup_on_another_gpu_first() -> None:
    table = build_rule_table(make_bundle())  # fraud-scorer's budget redirects to fraud-scorer-lite
    pool = _Pool([_M("fraud-scorer", "10.0.0.1:81", "h1/gpu0"), _M("fraud-scorer-lite", "10.0.0.1:82", "h1/gpu0"),
                  _M("fraud-scorer-lite", "10.0.0.2:82", "h2/gpu0"), _M("other", "10.0.0.3:83", "h3/gpu0")])
    assert dict(quarantine_targets(table, pool)) == {
        "10.0.0.1:81": "10.0.0.2:82",  # the backup model, not on the primary's GPU
        "10.0.0.1:82": None, "10.0.0.2:82": None,  # the backup has no redirect breaker: nowhere to go
        "10.0.0.3:83": None}
    assert dict(quarantine_targets(table, _Pool([_M("fraud-scorer", "10.0.0.1:81", "h1/gpu0")]))) == {"10.0.0.1:81": None}


def test_an_unregistered_backend_leaves_the_guardian_and_the_quarantine_cap() -> None:
    g, audit = _guardian(consecutive=1)
    try:
        a, b, c, d, backup = (Endpoint.parse(f"127.0.0.1:{p}") for p in (9001, 9002, 9003, 9004, 9100))
        for ep in (a, b, c, d):
            g.register_backend(ep, backup)
        first = g.backend_id(c)
        g.unregister_backend(c)
        g.unregister_backend(d)
        assert g.backends() == {a: backup, b: backup}
        g.observe_backend(a, {"error_rate": 1.0})  # half of two backends: one may be out
        g.observe_backend(b, {"error_rate": 1.0})  # with c and d still counted, half of four would allow a second
        done, refused = [r for r in audit.records if r.kind is ActionKind.QUARANTINE]
        assert done.outcome is not Outcome.REFUSED, done
        assert refused.outcome is Outcome.REFUSED and "cap reached: 1 of 2 backends out" in refused.detail
        g.register_backend(c, backup)
        assert g.backend_id(c) == first  # counted on under the same id
    finally:
        g.close()
