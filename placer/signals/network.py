"""Network: no path from the ingress to the GPU's admissible port without crossing a
congested or failed hop (the fabric search's distances are infinite)."""

from __future__ import annotations

import numpy as np

from ..framework import Column, Signal, Stage, TickInputs, Words
from ..plan import Constraint
from .port import would


class Network(Signal[TickInputs]):
    name = "network"
    constraint = Constraint.NETWORK
    consumes = ("link_util", "link_up", "switch_watermark")
    stage = Stage.TICK
    reads_paths = True

    def reference(self, x: TickInputs) -> Column:
        return Column(fail=~np.isfinite(x.paths.net))

    def detail(self, w: Words, r: int) -> str:
        return "no path from the ingress without crossing a congested or failed hop" + would(w, r)
