"""Fixtures for the enforcer tests: one kernel plane per session, one netns per test.

Privileges are detected up front. Without root/BPF the kernel tests skip and say why; as
root or under CI=true a kernel plane that fails to load fails them (never a silent skip).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from policyc.compiler.bundle import (
    Breaker,
    Bundle,
    CancelStream,
    Compute,
    Contract,
    Dependencies,
    Interval,
    Memory,
    Quarantine,
    Redirect,
    ReportAnomaly,
    SignalCondition,
    Slo,
    SourceRef,
)
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.privileges import kernel_support

HERE = Path(__file__).parent
REF = SourceRef(file="tests/enforcer", line=1, col=1)


def _must_run_kernel() -> bool:
    return os.geteuid() == 0 or os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def kernel_audit() -> MemoryAudit:
    return MemoryAudit()


@pytest.fixture(scope="session")
def kernel_plane(kernel_audit: MemoryAudit):  # type: ignore[no-untyped-def]
    support = kernel_support()
    if not support.available and not _must_run_kernel():
        pytest.skip(f"kernel plane not testable here: {support.reason}")
    from policyc.enforcer.kernel_plane import KernelPlane

    plane = KernelPlane(kernel_audit)  # as root or under CI, a failure here fails the tests
    yield plane
    plane.close()


@pytest.fixture
def netns(kernel_plane) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh network namespace with `lo` up and the kernel plane's TC programs on it."""
    name = f"pc-enf-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
    kernel_plane.clear_observations()
    kernel_plane.attach_tc("lo", name)
    try:
        yield name
    finally:
        kernel_plane.detach_tc("lo", name)
        for ep in list(kernel_plane.quarantined()):
            kernel_plane.release(ep)
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def cgroup(kernel_plane) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """A private cgroup v2 with the connect hooks attached."""
    root = kernel_plane.cgroup2_root
    assert root is not None, "cgroup v2 is not mounted: the connect hooks need it"
    path = root / f"policyc-enforcer-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    kernel_plane.attach_cgroup(path)
    try:
        yield path
    finally:
        kernel_plane.detach_cgroup(path)
        procs = (path / "cgroup.procs").read_text().split()
        parent_procs = root / "cgroup.procs"
        for pid in procs:
            try:
                parent_procs.write_text(pid)
            except OSError:
                pass
        path.rmdir()


def make_bundle(*, slo: float = 0.2, fraction: float = 0.925, model: str = "fraud-scorer", extra: tuple[Breaker, ...] = (),
                quarantine: Quarantine | None = None) -> Bundle:
    """The reference budget rule as data: 185 of 200 ms -> cancel, redirect with X-Retry-Count: 1, report."""
    contract = Contract(
        name=model, version="1.0",
        compute=Compute(flops=Interval(lo=1.2e12, hi=1.5e12), per="request", tokens=128),
        memory=Memory(bandwidth_min=80e9, burst_max=0.2), dependencies=Dependencies(),
        slo=Slo(latency=slo), origin=REF,
    )
    actions: list = [CancelStream(), Redirect(backup=f"{model}-lite", variant="simplified", headers=(("X-Retry-Count", "1"),)), ReportAnomaly()]
    if quarantine is not None:
        actions.append(quarantine)
    budget = Breaker(
        name="slo-budget", scope="request", models=(model,),
        conditions=(SignalCondition(signal="elapsed", cmp=">=", value=fraction, of="slo", origin=REF),),
        actions=tuple(actions), origin=REF,
    )
    return Bundle(compiler_version="test", contracts=(contract,), breakers=(budget, *extra))
