"""GPU class: the solver (or the catalog) rules the class out for this contract, or the
catalog has no peak for the class at the contract's precision."""

from __future__ import annotations

import numpy as np

from policyc.compiler.meaning import compute_rate

from ..framework import Column, ContractInputs, Signal, Stage, Words
from ..plan import Constraint


class GpuClass(Signal[ContractInputs]):
    name = "gpu_class"
    constraint = Constraint.GPU_CLASS
    consumes = ()  # structure and catalog only
    stage = Stage.CONTRACT

    def reference(self, x: ContractInputs) -> Column:
        """Per candidate: its class's share bound, and its class's peak at the precision."""
        t, c = x.topology, x.contract
        models = [t.gpus[i].model for i in np.arange(len(t.gpus))[x.gpus].tolist()]
        infeasible = np.array([not x.bounds[m].feasible for m in models], dtype=bool)
        prec = c.compute.precision
        peaks = {m: (x.catalog[m].peak(prec) if m in x.catalog else None) for m in set(models)}
        no_peak = np.array([not peaks[m] for m in models], dtype=bool)  # no peak (or a zero one): unbounded compute
        return Column(fail=infeasible | no_peak)

    def column(self, x: ContractInputs) -> Column:
        """Per GPU class of the topology, then gathered per GPU."""
        names, model_idx = x.topology.gpu_models
        rated = [compute_rate(x.contract.compute, x.catalog[m]) if m in x.catalog else None for m in names]
        per_class = np.array([not x.bounds[m].feasible or r is None or r != r for m, r in zip(names, rated)], dtype=bool)
        return Column(fail=per_class[model_idx][x.gpus])

    def detail(self, w: Words, r: int) -> str:
        return w.bounds[w.snap.topology.gpus[int(w.ev.gpus[r])].model].detail
