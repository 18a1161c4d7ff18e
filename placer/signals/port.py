"""RDMA port: neither host-local port (the GPU's NUMA node's, or the other socket's) is up
and within the watermark and utilisation limits."""

from __future__ import annotations

import math

from ..framework import Column, Signal, Stage, TickInputs, Words
from ..plan import Constraint


class Port(Signal[TickInputs]):
    name = "port"
    constraint = Constraint.PORT
    consumes = ("port_up", "port_watermark", "port_util")
    stage = Stage.TICK
    reads_paths = True

    def reference(self, x: TickInputs) -> Column:
        return Column(fail=~x.paths.any_ok)

    def detail(self, w: Words, r: int) -> str:
        t, f, th = w.snap.topology, w.snap.frame, w.th
        g = int(w.ev.gpus[r])
        local, remote = t.gpu_ports
        parts = []
        for p in (int(local[g]), int(remote[g])):
            if p >= 0:
                state = ("down" if not f.port_up[p] else
                         f"watermark {f.port_watermark[p]:.0%} > {th.max_port_watermark:.0%}"
                         if f.port_watermark[p] > th.max_port_watermark
                         else f"utilisation {f.port_util[p]:.0%} > {th.max_port_util:.0%}")
                parts.append(f"{t.port_key(p)} {state}")
        return "RDMA port " + "; ".join(parts) + would(w, r)


def would(w: Words, r: int) -> str:
    """What the candidate would predict with the port limits ignored, for a refusal's words."""
    raw = w.ev.raw_total[r]
    return f" (would predict {raw * 1e3:.1f} ms)" if math.isfinite(raw) else ""
