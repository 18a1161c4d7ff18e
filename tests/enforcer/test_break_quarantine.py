"""A budget break with the quarantine action: every stream of a burst is cancelled before
the first quarantine of that burst lands (the quarantine waits for a moment free of
crossings), and each quarantine still happens, is audited, is timed and expires."""

from __future__ import annotations

import threading
import time
import warnings

from enforcer_support import make_bundle  # noqa: E402

from policyc.compiler.bundle import Quarantine
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.executor import ActionExecutor
from policyc.enforcer.guardian import Guardian
from policyc.enforcer.records import ActionKind, Outcome
from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane


class _Stream:
    def __init__(self, cancels: list[tuple[str, float]], name: str) -> None:
        self._cancels, self._name = cancels, name

    def cancel(self) -> bool:
        self._cancels.append((self._name, time.monotonic()))
        return True


class _TimedPlane(UserSpacePlane):
    """The user-space plane, noting when each quarantine reached it."""

    def __init__(self, audit: MemoryAudit) -> None:
        super().__init__(audit, reason="test")
        self.landed: list[tuple[Endpoint, float]] = []

    def quarantine(self, backend: Endpoint, backup: Endpoint, rule: int, until_monotonic_ns: int) -> None:
        self.landed.append((backend, time.monotonic()))
        super().quarantine(backend, backup, rule, until_monotonic_ns)


class _NoAnomalies:
    def report_anomaly(self, gpu_key: str, signal: str, value: float) -> None:
        pass


def _guardian(quarantine: Quarantine) -> tuple[Guardian, _TimedPlane, MemoryAudit]:
    """A guardian on the timed user-space plane whose breaks cancel and quarantine."""
    audit = MemoryAudit()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelEnforcementOff)
        plane = _TimedPlane(audit)
    bundle = make_bundle(slo=0.02, quarantine=quarantine)
    g = Guardian(bundle, plane=plane, anomalies=_NoAnomalies(), audit=audit, executor=ActionExecutor(audit, rebalance=lambda n: None))
    return g, plane, audit


def test_a_bursts_cancels_all_come_before_its_quarantines_which_still_happen_and_expire() -> None:
    g, plane, audit = _guardian(Quarantine(duration=0.3, max_duration=1.0, max_share=1.0))
    backup = Endpoint.of("127.0.0.1", 9)
    backends = [Endpoint.of("10.250.0.1", 2000 + i) for i in range(12)]
    for be in backends:
        g.register_backend(be, backup)
    cancels: list[tuple[str, float]] = []
    start = time.monotonic()
    deadlines = [g.begin(f"r{i}", "fraud-scorer", _Stream(cancels, f"r{i}"), backend=be, started=start)  # one burst: due at once
                 for i, be in enumerate(backends)]
    late = g.begin("late", "fraud-scorer", _Stream(cancels, "late"), backend=Endpoint.of("10.250.0.2", 1), started=start + 0.0008)
    assert late is not None and all(d == deadlines[0] for d in deadlines)
    wait_until = time.monotonic() + 5
    while len(g.break_timings) < len(backends) + 1 and time.monotonic() < wait_until:
        time.sleep(0.005)
    try:
        assert len(g.break_timings) == len(backends) + 1, g.break_timings
        assert sorted(n for n, _ in cancels) == sorted([f"r{i}" for i in range(len(backends))] + ["late"])
        last_cancel = max(at for _, at in cancels)
        first_landed = min(at for _, at in plane.landed)
        # the burst's quarantines wait for room: past the crossing 0.8 ms behind the burst, whose
        # cancel is not made to wait for them (on the old path the first one landed before it)
        assert first_landed > last_cancel, "a quarantine landed before every stream due by then was cancelled"
        assert first_landed >= late
        assert {be for be, _ in plane.landed} == set(backends)
        assert set(plane.quarantined()) == set(backends)  # the late request's backend is not registered: refused
        done = [r for r in audit.records if r.kind is ActionKind.QUARANTINE and r.outcome is Outcome.DONE]
        assert {r.target for r in done} == {str(be) for be in backends}
        refused = [r for r in audit.records if r.kind is ActionKind.QUARANTINE and r.outcome is Outcome.REFUSED]
        assert [r.target for r in refused] == ["10.250.0.2:1"]  # not a registered backend: said so
        assert all(t.map_update_s is not None and t.map_update_s >= t.cancel_s for t in g.break_timings)
        time.sleep(0.35)  # the quarantines run out: the guardian releases them, audited
        assert set(g.tick()) == set(backends)
        assert plane.quarantined() == {}
    finally:
        g.close()


def test_quarantines_deferred_at_close_still_happen() -> None:
    g, plane, _ = _guardian(Quarantine(duration=5, max_duration=10, max_share=1.0))
    be = Endpoint.of("10.250.0.3", 80)
    g.register_backend(be, Endpoint.of("127.0.0.1", 9))
    crossed = threading.Event()

    class _Signal(_Stream):
        def cancel(self) -> bool:
            crossed.set()
            return True

    g.begin("r", "fraud-scorer", _Signal([], "r"), backend=be)
    assert crossed.wait(timeout=5)
    g.close()  # whether or not the deferred quarantine had run yet
    assert plane.quarantined() == {be: Endpoint.of("127.0.0.1", 9)}
