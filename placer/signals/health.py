"""Health: a GPU reported failing (ECC, XID, throttling), flagged by an anomaly report, or
whose SM throughput collapsed, below the thresholds' least health."""

from __future__ import annotations

from ..framework import Column, Signal, Stage, TickInputs, Words
from ..plan import Constraint


class Health(Signal[TickInputs]):
    name = "health"
    constraint = Constraint.HEALTH
    consumes = ("gpu_health", "gpu_sm_util")  # the snapshot's effective health derives from both
    stage = Stage.TICK

    def reference(self, x: TickInputs) -> Column:
        return Column(fail=x.snap.gpu_health[x.gpus] < x.th.min_health)

    def detail(self, w: Words, r: int) -> str:
        snap, g = w.snap, int(w.ev.gpus[r])
        why = "SM throughput collapsed" if snap.gpu_collapsed[g] else "reported health"
        return (f"health {snap.gpu_health[g]:.2f} < {w.th.min_health:.2f} ({why}, SM utilisation "
                f"{snap.frame.gpu_sm_util[g]:.0%})")
