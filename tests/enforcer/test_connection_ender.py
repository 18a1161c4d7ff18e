"""The connection ender: a burst of quarantines ends its connections in one call (one walk of
the kernel's socket table per family), each quarantine's outcome reported on its own, a
failing backend reported as failed without failing the others, and nothing left at close."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence

from policyc.enforcer.connection_ender import ConnectionEnder, Outcome
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.userspace_plane import KernelEnforcementOff, UserSpacePlane

BACKENDS = [Endpoint.of("10.0.0.1", 80 + i) for i in range(5)]


class CountingPlane(UserSpacePlane):
    """The user-space plane (it ends the connections it was told how to close), counting
    the batch calls, with one backend whose connections cannot be ended."""

    def __init__(self, broken: Endpoint | None = None) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelEnforcementOff)
            super().__init__(None, reason="test")
        self.batches: list[list[Endpoint]] = []
        self.broken = broken

    def end_connections(self, backend: Endpoint) -> int:
        if backend == self.broken:
            raise OSError(f"cannot end connections to {backend}")
        return super().end_connections(backend)

    def end_connections_many(self, backends: Sequence[Endpoint]) -> dict[Endpoint, int]:
        self.batches.append(list(backends))
        if self.broken in backends:  # as the kernel's listing fails: before anything is ended
            raise OSError("listing connections failed")
        return super().end_connections_many(backends)


def _ender(plane: CountingPlane) -> tuple[ConnectionEnder, list[tuple[Endpoint, str, Outcome]], threading.Semaphore]:
    reports: list[tuple[Endpoint, str, Outcome]] = []
    seen = threading.Semaphore(0)

    def done(backend: Endpoint, rule: str, outcome: Outcome) -> None:
        reports.append((backend, rule, outcome))
        seen.release()
    return ConnectionEnder(plane, done, window=0.05), reports, seen


def test_a_burst_is_one_call_and_each_quarantine_is_reported() -> None:
    plane = CountingPlane()
    closed: list[int] = []
    for i, b in enumerate(BACKENDS):
        for _ in range(i):
            plane.on_end_connections(b, lambda i=i: closed.append(i))
    ender, reports, seen = _ender(plane)
    for b in BACKENDS:
        ender.submit(b, "slo-budget")
    ender.submit(BACKENDS[3], "backend-errors")  # named twice in the burst: its connections end once
    for _ in range(len(BACKENDS) + 1):
        assert seen.acquire(timeout=5)
    assert plane.batches == [BACKENDS]
    assert reports[:5] == [(b, "slo-budget", i) for i, b in enumerate(BACKENDS)]
    assert reports[5] == (BACKENDS[3], "backend-errors", 0)
    assert sorted(closed) == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    ender.close()


def test_a_failing_backend_fails_alone() -> None:
    plane = CountingPlane(broken=BACKENDS[1])
    plane.on_end_connections(BACKENDS[0], lambda: None)
    ender, reports, seen = _ender(plane)
    for b in BACKENDS[:3]:
        ender.submit(b, "r")
    for _ in range(3):
        assert seen.acquire(timeout=5)
    outcomes = {b: o for b, _, o in reports}
    assert outcomes[BACKENDS[0]] == 1 and outcomes[BACKENDS[2]] == 0
    assert isinstance(outcomes[BACKENDS[1]], OSError) and str(BACKENDS[1]) in str(outcomes[BACKENDS[1]])
    ender.close()


def test_close_ends_what_was_submitted() -> None:
    plane = CountingPlane()
    ender, reports, _ = _ender(plane)
    ender.submit(BACKENDS[0], "r")
    ender.close()
    assert [b for b, _, _ in reports] == [BACKENDS[0]]
