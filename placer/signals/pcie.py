"""PCIe: a GPU whose host link is busier than the thresholds allow."""

from __future__ import annotations

from ..framework import Column, Signal, Stage, TickInputs, Words
from ..plan import Constraint


class Pcie(Signal[TickInputs]):
    name = "pcie"
    constraint = Constraint.PCIE
    consumes = ("gpu_pcie_util",)
    stage = Stage.TICK

    def reference(self, x: TickInputs) -> Column:
        return Column(fail=x.snap.frame.gpu_pcie_util[x.gpus] > x.th.max_pcie_util)

    def detail(self, w: Words, r: int) -> str:
        return f"PCIe utilisation {w.snap.frame.gpu_pcie_util[int(w.ev.gpus[r])]:.0%} > {w.th.max_pcie_util:.0%}"
