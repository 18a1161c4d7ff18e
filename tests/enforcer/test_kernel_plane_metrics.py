"""The kernel plane counts the BPF programs it has attached (the decision service's
`policyc_enforcer_programs_attached`): two per observed interface, two per cgroup."""

from __future__ import annotations

from pathlib import Path

from policyc.enforcer.kernel_plane import KernelPlane
from policyc.server.rpc_metrics import EnforcerSeries


def test_attached_programs_follow_attach_and_detach(kernel_plane: KernelPlane, netns: str, cgroup: Path) -> None:
    assert kernel_plane.attached_programs() == 4  # the netns's lo (ingress, egress) and the cgroup (connect4, connect6)
    series = {s.name: s.value for m in EnforcerSeries([], lambda: 0, kernel_plane.attached_programs).collect() for s in m.samples}
    assert series["policyc_enforcer_programs_attached"] == 4
    kernel_plane.detach_cgroup(cgroup)
    assert kernel_plane.attached_programs() == 2
    kernel_plane.attach_cgroup(cgroup)  # the fixture detaches it again
