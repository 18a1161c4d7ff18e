"""GPU share: less share of the GPU free (the snapshot's, less what this tick reserved)
than the least the contract needs on its class (the solver's bound, or the catalog's).

A `REQUEST` signal: the share reserved so far this tick changes with every placement, so
its filter is the runners' per-request arithmetic (`refuses`; `lookup.scalar_rows` unrolls
it for a handful of candidates)."""

from __future__ import annotations

import numpy as np

from ..framework import Column, RequestInputs, Signal, Stage, Words
from ..plan import Constraint


def refuses(free: np.ndarray, min_share: np.ndarray) -> np.ndarray:
    """The candidates with less free share than they need."""
    return free < min_share


class GpuShare(Signal[RequestInputs]):
    name = "gpu_share"
    constraint = Constraint.GPU_SHARE
    consumes = ("gpu_sm_util", "gpu_demand")  # the snapshot's free share derives from both
    stage = Stage.REQUEST

    def reference(self, x: RequestInputs) -> Column:
        return Column(fail=refuses(x.free, x.min_share))

    def detail(self, w: Words, r: int) -> str:
        g = int(w.ev.gpus[r])
        held = w.held(g)  # the share placed on this snapshot since it was taken counts against it
        free = w.snap.gpu_free[g]
        since = f" ({free:.3f} free on the snapshot, {held:.3f} placed since)" if held else ""
        b = w.bounds.get(w.snap.topology.gpus[g].model)
        why = f": {b.detail}" if b is not None and not b.feasible and b.min_share > 1.0 else ""  # a request no share can serve
        return f"free share {free - held:.3f} < required {w.ev.min_share[r]:.3f}{since}{why}"
