"""Adapters between the enforcer and the rest: the guardian's plane, anomaly sink, executor
and audit sink, and the telemetry feed of its GPU rules.

The guardian's anomaly sink calls `report_anomaly(gpu_key, signal, value)`, which is the
placer's own signature (`host/gpuN`), so the placer is the sink. Self-heal's rebalance
step is the placer's `rebalance(host)`. Actions go to the audit log when one is open and
are otherwise kept in memory (`MemoryAudit`), never lost silently.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable, Sequence

import numpy as np

from policyc.compiler.bundle import Bundle
from policyc.enforcer.collaborators import MemoryAudit
from policyc.enforcer.executor import ActionExecutor, HealTarget
from policyc.enforcer.guardian import Guardian, GpuVerdict
from policyc.enforcer.records import ActionKind, ActionRecord, Outcome
from policyc.placer import Placer, Snapshot
from policyc.placer.snapshot import COLLAPSE_MIN_DEMAND
from policyc.placer.topology import GpuSlot

from .audit_bridge import AuditBridge
from .config import EnforcerMode, SelfHeal
from .engine import DecisionEngine
from .node_rebalance import NodeRebalance

SM_SIGNAL = "sm_utilization"


class ActionSink:
    """Every enforcer action: kept in memory (for the demo and tests) and audited when a log is open."""

    def __init__(self, audit: AuditBridge | None) -> None:
        self.memory = MemoryAudit()
        self.audit = audit

    def __call__(self, record: ActionRecord) -> None:
        self.memory(record)
        if self.audit is not None:
            self.audit.action(record)


def make_guardian(bundle: Bundle, mode: EnforcerMode, placer: Placer, audit: AuditBridge | None, *,
                  self_heal: SelfHeal = SelfHeal.DRY_RUN, engine: DecisionEngine | None = None,
                  slots: Callable[[], Sequence[GpuSlot]] | None = None) -> tuple[Guardian, ActionSink]:
    """The guardian with its plane, sink and executor. `self_heal` EXECUTE (the operator's
    switch) lets the executor run hardware steps and rebalance for real; the switch itself
    is the first record. With `engine` and `slots`, rebalance cordons, drains and moves the
    node's instances (`NodeRebalance`); otherwise it only releases the placer's sessions."""
    from policyc.enforcer.plane import EnforcementPlane, open_plane
    from policyc.enforcer.userspace_plane import UserSpacePlane

    sink = ActionSink(audit)
    execute = self_heal is SelfHeal.EXECUTE
    if execute:
        sink(ActionRecord(time=time.time(), kind=ActionKind.SELF_HEAL_STEP, target="self_heal_mode", rule="",
                          outcome=Outcome.DONE, detail="the operator switched self-heal to execute (--self-heal execute): "
                          "GPU reset, RDMA link refresh and rebalance run for real", source="operator"))
    rebalance: Callable[[str], object] = placer.rebalance
    if engine is not None and slots is not None:
        rebalance = NodeRebalance(engine, placer, sink, slots, execute=execute)
    if mode is EnforcerMode.USERSPACE:
        plane: EnforcementPlane
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plane = UserSpacePlane(sink, reason="the decision service was started with --enforcer userspace")
    else:
        plane = open_plane(sink, require_kernel=mode is EnforcerMode.KERNEL)
    g = Guardian(bundle, plane=plane, anomalies=placer, audit=sink,
                 executor=ActionExecutor(sink, rebalance=rebalance, allow_real=execute))
    return g, sink


class GpuWatch:
    """Feeds each busy GPU's SM utilisation from every new snapshot to the guardian's GPU
    rules (the simulated cluster and NVML both report it), and remembers what fired.

    Only GPUs carrying work (demand at least the placer's `COLLAPSE_MIN_DEMAND`) are
    observed: an idle GPU's low SM utilisation says nothing about a fault, and feeding it
    would make every idle GPU "collapse" and self-heal."""

    def __init__(self, guardian: Guardian) -> None:
        self.guardian = guardian
        self.fired: list[tuple[str, GpuVerdict]] = []
        self._targets: set[str] = set()

    def on_refresh(self, new: Snapshot, previous: Snapshot | None) -> None:
        t = new.topology
        busy = np.nonzero(new.frame.gpu_demand >= COLLAPSE_MIN_DEMAND)[0].tolist()
        keys = [t.gpu_key(i) for i in busy]
        local_port = t.gpu_ports[0]
        for i, key in zip(busy, keys):
            if key not in self._targets:  # what a self-heal step acts on: this GPU's index and RDMA link
                p = int(local_port[i])
                link = t.port_key(p).rpartition("/")[2] + "/1" if p >= 0 else ""
                gpu_id = t.gpus[i].gpu_id
                self.guardian.set_heal_target(HealTarget(key, key.rpartition("/")[0], gpu_id.removeprefix("gpu"), link))
                self._targets.add(key)
        for key, verdict in self.guardian.observe_gpus(keys, SM_SIGNAL, new.frame.gpu_sm_util[busy]):
            if verdict.fired:
                self.fired.append((key, verdict))
